// SPDX-License-Identifier: Apache-2.0

package netns

import "os"

// DatapathAttachEnv names the variable that sets how the privileged tests'
// agents and loaders attach the datapath (--datapath-attach): CI runs the
// privileged tiers a second time with it set to tc, so that the tc (clsact)
// attachment of kernels older than 6.6 is tested on a kernel with tcx.
const DatapathAttachEnv = "L4XDS_DATAPATH_ATTACH"

// DatapathAttach is the --datapath-attach of the tests' agents:
// $L4XDS_DATAPATH_ATTACH, else auto.
func DatapathAttach() string {
	if v := os.Getenv(DatapathAttachEnv); v != "" {
		return v
	}
	return "auto"
}

// DatapathAttachArgs is DatapathAttach as arguments of an agent.
func DatapathAttachArgs() []string { return []string{"--datapath-attach", DatapathAttach()} }
