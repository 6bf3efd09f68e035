// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// rejectLimit is the reject limit of one CPU of cpus, as the program takes
// it (reject_interval_ns, reject_burst_ns; see struct lb_reject_bucket in
// bpf/l4xds.h): the node's rate and burst (--lb-reject-rate,
// --lb-reject-burst) shared between the CPUs, each of which keeps a bucket
// of its own. A CPU sends one reject per interval (rate/cpus a second) and
// saves up burst/cpus of them, but at least one. Rate 0: none (burst 0).
func rejectLimit(rate, burst uint, cpus int) (intervalNS, burstNS uint64) {
	if rate == 0 || cpus < 1 {
		return 0, 0
	}
	const second = uint64(1e9)
	intervalNS = max(uint64(cpus)*second/uint64(rate), 1)
	burstNS = max(uint64(burst)*second/uint64(rate), intervalNS)
	return intervalNS, burstNS
}

// onlineCPUsFile lists the CPUs that process packets.
const onlineCPUsFile = "/sys/devices/system/cpu/online"

// onlineCPUs counts the CPUs online, which share the reject limit: those
// that can run the program (possible CPUs may be many more, never online).
func onlineCPUs() (int, error) {
	b, err := os.ReadFile(onlineCPUsFile)
	if err != nil {
		return 0, err
	}
	n, err := countCPUs(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", onlineCPUsFile, err)
	}
	return n, nil
}

// countCPUs counts the CPUs of a kernel CPU list ("0-3,5,7-8").
func countCPUs(list string) (int, error) {
	n := 0
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("CPU list %q: %w", list, err)
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("CPU list %q: %w", list, err)
			}
		}
		if first < 0 || last < first {
			return 0, fmt.Errorf("CPU list %q: bad range %q", list, part)
		}
		n += last - first + 1
	}
	return n, nil
}
