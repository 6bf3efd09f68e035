// SPDX-License-Identifier: Apache-2.0

package option

import (
	"strings"
	"testing"

	"github.com/cilium/hive"
)

// --log-format takes text or json; anything else stops the agent before
// it starts, naming the flag.
func TestAgentCommandLogFormat(t *testing.T) {
	cmd := AgentCommand("l4xds-agent", "", hive.New())
	cmd.SetArgs([]string{"--log-format", "yaml"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `--log-format "yaml"`) {
		t.Fatalf("--log-format yaml: %v", err)
	}
}
