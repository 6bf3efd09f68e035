// SPDX-License-Identifier: Apache-2.0

// l4xds-traffic is the traffic source and sink of the end-to-end tests and
// the demo. Run it inside network namespaces (`ip netns exec`):
//
//	serve  answers every TCP connection and UDP datagram with its name
//	probe  opens N new flows to an address and counts which backend answered
//	hold   keeps one TCP connection open and echoes over it at an interval
//	load   sends as much traffic as an address answers and reports the rates
//	dns    asks a DNS server for a name's A records, over UDP or TCP
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/l4xds/l4xds/pkg/version"
)

// Exit codes: 1 means traffic failed (a probe flow, a held connection), 2
// that the tool could not run at all.
const (
	exitTrafficFailed = 1
	exitError         = 2
)

// errTrafficFailed ends a command that printed its failures already.
type errTrafficFailed struct{}

func (errTrafficFailed) Error() string { return "traffic failed" }

func main() {
	root := &cobra.Command{
		Use:           "l4xds-traffic",
		Short:         "TCP and UDP traffic for testing l4xds: servers that say their name, probes that count them",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	version.AddFlag(root)
	root.AddCommand(serveCommand(), probeCommand(), holdCommand(), loadCommand(), dnsCommand())
	if err := root.Execute(); err != nil {
		if _, ok := err.(errTrafficFailed); ok {
			os.Exit(exitTrafficFailed)
		}
		fmt.Fprintln(os.Stderr, "l4xds-traffic:", err)
		os.Exit(exitError)
	}
}

// outputFormat is the -o flag of the commands that report: text or json, checked
// when the flag is parsed.
type outputFormat string

const (
	outputText outputFormat = "text"
	outputJSON outputFormat = "json"
)

func (o *outputFormat) String() string { return string(*o) }
func (o *outputFormat) Type() string   { return "text|json" }

func (o *outputFormat) Set(s string) error {
	if v := outputFormat(s); v == outputText || v == outputJSON {
		*o = v
		return nil
	}
	return errors.New("want text or json")
}

// report prints a command's report: as indented JSON with -o json, else as
// text.
func report(o outputFormat, r any, text func(io.Writer)) {
	if o == outputJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(r)
		return
	}
	text(os.Stdout)
}
