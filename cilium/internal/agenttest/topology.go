// SPDX-License-Identifier: Apache-2.0

package agenttest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/l4xds/l4xds/test/netns"
)

// createTopology makes the three network namespaces and their links (see
// the package comment) and registers their deletion.
func (e *Env) createTopology() error {
	for _, ns := range []string{e.Client, e.Node, e.Backends} {
		if err := ip("netns", "add", ns); err != nil {
			return err
		}
		e.onCleanup(func() error { return deleteNamespace(ns) })
		if err := ip("-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	// The node forwards between its two devices; rp_filter off because
	// NATed packets cross interfaces a strict reverse-path check would not
	// expect.
	if err := sysctl(e.Node, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", e.Node, "link", "add", ClientDevice, "type", "veth", "peer", "name", "eth0", "netns", e.Client},
		{"-n", e.Node, "addr", "add", NodeClientIP.String() + "/24", "dev", ClientDevice},
		{"-n", e.Node, "link", "set", ClientDevice, "up"},
		{"-n", e.Node, "link", "add", BackendDevice, "type", "veth", "peer", "name", "eth0", "netns", e.Backends},
		{"-n", e.Node, "addr", "add", NodeBackendIP.String() + "/24", "dev", BackendDevice},
		{"-n", e.Node, "link", "set", BackendDevice, "up"},

		{"-n", e.Client, "addr", "add", ClientIP.String() + "/24", "dev", "eth0"},
		{"-n", e.Client, "link", "set", "eth0", "up"},
		{"-n", e.Client, "route", "add", "default", "via", NodeClientIP.String()},
	}
	for _, a := range e.BackendIPs {
		steps = append(steps, []string{"-n", e.Backends, "addr", "add", a.String() + "/24", "dev", "eth0"})
	}
	steps = append(steps,
		[]string{"-n", e.Backends, "link", "set", "eth0", "up"},
		[]string{"-n", e.Backends, "route", "add", "default", "via", NodeBackendIP.String()},
	)
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return err
		}
	}
	return nil
}

// deleteNamespace deletes a namespace of the topology. Its processes were
// all started by the test and stopped before (the agent, servers, probes);
// a namespace already gone is not an error.
func deleteNamespace(ns string) error {
	if _, err := os.Stat("/run/netns/" + ns); err != nil {
		return nil
	}
	return ip("netns", "delete", ns)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// sysctl writes key=value settings under /proc/sys from inside ns.
func sysctl(ns string, settings ...string) error {
	var script []string
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		script = append(script, fmt.Sprintf("echo %s > /proc/sys/%s", v, strings.ReplaceAll(k, ".", "/")))
	}
	out, err := netns.Command(context.Background(), ns, "sh", "-ec", strings.Join(script, "\n")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sysctl %s in %s: %w: %s", strings.Join(settings, " "), ns, err, bytes.TrimSpace(out))
	}
	return nil
}
