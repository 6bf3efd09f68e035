// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MinKernel is the oldest Linux the datapath runs on: the program forwards
// with bpf_redirect_neigh (5.10), and below 6.6 it is attached with tc
// (--datapath-attach).
var MinKernel = KernelVersion{Major: 5, Minor: 10}

// KernelVersion is the major and minor number of a Linux release.
type KernelVersion struct{ Major, Minor int }

func (v KernelVersion) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

func (v KernelVersion) less(w KernelVersion) bool {
	return v.Major < w.Major || v.Major == w.Major && v.Minor < w.Minor
}

// parseKernelRelease reads major.minor from a uname release:
// "5.10.0-23-amd64", "6.1.0+", "5.14.0-427.el9.x86_64", "4.19".
func parseKernelRelease(release string) (KernelVersion, bool) {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return KernelVersion{}, false
	}
	major, err := strconv.Atoi(parts[0])
	if err != nil {
		return KernelVersion{}, false
	}
	// The minor number ends where its digits do ("10-rc1", "4+").
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(parts[1])
	}
	minor, err := strconv.Atoi(parts[1][:digits])
	if err != nil {
		return KernelVersion{}, false
	}
	return KernelVersion{major, minor}, true
}

// checkKernel returns the error the agent stops with on a kernel older than
// MinKernel. A release it cannot read passes: the load then names what the
// kernel lacks.
func checkKernel(release string) error {
	v, ok := parseKernelRelease(release)
	if !ok || !v.less(MinKernel) {
		return nil
	}
	return fmt.Errorf("l4xds needs Linux %s or newer (found %s): the datapath forwards with bpf_redirect_neigh "+
		"and attaches with tc (clsact), or with tcx from Linux 6.6", MinKernel, release)
}

// kernelRelease is uname -r.
func kernelRelease() (string, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return "", fmt.Errorf("uname: %w", err)
	}
	return unix.ByteSliceToString(uts.Release[:]), nil
}
