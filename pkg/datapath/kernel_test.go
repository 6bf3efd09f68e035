// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/l4xds/l4xds/pkg/datapath/bpf"
)

func TestCheckKernel(t *testing.T) {
	for _, c := range []struct {
		release string
		want    string // in the error; "" for none
	}{
		// The distributions' kernels the datapath must run on.
		{"5.10.0-23-amd64", ""},               // Debian 11
		{"5.14.0-427.13.1.el9_4.x86_64", ""},  // RHEL 9
		{"5.15.0-105-generic", ""},            // Ubuntu 22.04
		{"6.1.0-21-cloud-amd64", ""},          // Debian 12
		{"6.1.94-99.176.amzn2023.x86_64", ""}, // Amazon Linux 2023
		{"6.6.0", ""},                         // tcx
		{"6.18.44-fc-v657", ""},               //
		{"10.0", ""},                          // a major above, whatever the minor
		{"5.10", ""},                          //
		{"5.10-rc1", ""},                      //
		{"5.9.16", "needs Linux 5.10 or newer (found 5.9.16)"},
		{"5.4.0-177-generic", "needs Linux 5.10 or newer (found 5.4.0-177-generic)"}, // Ubuntu 20.04
		{"4.19.0-26-amd64", "l4xds needs Linux 5.10 or newer (found 4.19.0-26-amd64): "},
		{"3.10.0-1160.el7.x86_64", "(found 3.10.0-1160.el7.x86_64)"},
		{"4.19+", "(found 4.19+)"},
		// Unreadable: the load names what the kernel lacks.
		{"", ""},
		{"6", ""},
		{"linux", ""},
		{"x.10", ""},
		{"5.y", ""},
	} {
		err := checkKernel(c.release)
		if (err == nil) != (c.want == "") || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("release %q: error %v, want %q", c.release, err, c.want)
		}
	}
}

func TestParseKernelRelease(t *testing.T) {
	for release, want := range map[string]KernelVersion{
		"5.10.0-23-amd64":  {5, 10},
		"6.1.0+":           {6, 1},
		"4.19":             {4, 19},
		"5.4-rc3":          {5, 4},
		"6.18.44-fc-v657":  {6, 18},
		"5.15.0-1019-aws":  {5, 15},
		"5.14.0-427.el9_4": {5, 14},
	} {
		if got, ok := parseKernelRelease(release); !ok || got != want {
			t.Errorf("%q: %v (%v), want %v", release, got, ok, want)
		}
	}
}

// The program must load on MinKernel, which this machine may not run: what
// it asks of the kernel is checked against what Linux 5.10 has. Helpers
// are numbered in the order they were added; bpf_redirect_peer is 5.10's
// last. Atomics other than add (BPF_FETCH, xchg, cmpxchg) came in 5.12,
// and the instructions of -mcpu=v4 (sign extension, bswap, gotol) in 6.6.
// Kfuncs are out. The map types and flags are those of 5.10.
func TestProgramAsksNoMoreThanLinux510(t *testing.T) {
	spec, err := bpf.LoadL4xds()
	if err != nil {
		t.Fatal(err)
	}
	helpers := map[asm.BuiltinFunc]bool{}
	for name, prog := range spec.Programs {
		if prog.Type != ebpf.SchedCLS {
			t.Errorf("program %s: type %s, want SchedCLS (tc and tcx)", name, prog.Type)
		}
		for i, ins := range prog.Instructions {
			op := ins.OpCode
			var why string
			switch {
			case ins.IsKfuncCall():
				why = "a kfunc"
			case ins.IsBuiltinCall() && asm.BuiltinFunc(ins.Constant) > asm.FnRedirectPeer:
				why = fmt.Sprintf("helper %s, newer than bpf_redirect_peer", asm.BuiltinFunc(ins.Constant))
			case op.Class() == asm.StXClass && op.Mode() == asm.AtomicMode && op.AtomicOp() != asm.AddAtomic:
				why = fmt.Sprintf("atomic %v (Linux 5.12)", op.AtomicOp())
			case op.Class().IsLoad() && op.Mode() == asm.MemSXMode:
				why = "a sign-extending load (-mcpu=v4, Linux 6.6)"
			case op.Class().IsALU() && ins.Offset != 0:
				why = "a signed division or sign-extending move (-mcpu=v4, Linux 6.6)"
			case op.Class() == asm.ALU64Class && op.ALUOp() == asm.Swap:
				why = "bswap (-mcpu=v4, Linux 6.6)"
			case op.Class() == asm.Jump32Class && op.JumpOp() == asm.Ja:
				why = "gotol (-mcpu=v4, Linux 6.6)"
			}
			if ins.IsBuiltinCall() {
				helpers[asm.BuiltinFunc(ins.Constant)] = true
			}
			if why != "" {
				t.Errorf("program %s, instruction %d (%v): %s, which Linux %s lacks", name, i, ins, why, MinKernel)
			}
		}
	}
	if !helpers[asm.FnRedirectNeigh] || !helpers[asm.FnFibLookup] {
		t.Errorf("helpers called %v: not the program's (it forwards with bpf_fib_lookup and bpf_redirect_neigh)", slices.Sorted(maps.Keys(helpers)))
	}
	t.Logf("helpers called: %v", slices.Sorted(maps.Keys(helpers)))
	types := map[ebpf.MapType]bool{ebpf.Hash: true, ebpf.Array: true, ebpf.PerCPUHash: true, ebpf.PerCPUArray: true,
		ebpf.LRUHash: true, ebpf.LRUCPUHash: true, ebpf.LPMTrie: true, ebpf.HashOfMaps: true, ebpf.ArrayOfMaps: true}
	const flags = unix.BPF_F_NO_PREALLOC | unix.BPF_F_MMAPABLE | unix.BPF_F_RDONLY_PROG | unix.BPF_F_NO_COMMON_LRU
	for name, m := range spec.Maps {
		for _, m := range []*ebpf.MapSpec{m, m.InnerMap} {
			if m == nil {
				continue
			}
			if !types[m.Type] && !strings.HasPrefix(name, ".") {
				t.Errorf("map %s: type %s, not one of Linux %s checked here", name, m.Type, MinKernel)
			}
			if m.Flags&^flags != 0 {
				t.Errorf("map %s: flags %#x, not of Linux %s checked here", name, m.Flags&^flags, MinKernel)
			}
		}
	}
}

// The choice of --datapath-attach on kernels with and without tcx.
func TestResolveAttach(t *testing.T) {
	errProbe := errors.New("probe failed")
	for _, c := range []struct {
		mode     string
		tcx      bool
		probeErr error
		want     string
		err      string
	}{
		{mode: AttachAuto, tcx: true, want: AttachTCX},
		{mode: AttachAuto, tcx: false, want: AttachTC},
		{mode: AttachTCX, tcx: true, want: AttachTCX},
		{mode: AttachTCX, tcx: false, err: "--datapath-attach=tcx: the kernel has no tcx (Linux 6.6 or newer); tc or auto attaches with a tc filter"},
		{mode: AttachTC, tcx: true, want: AttachTC},
		{mode: AttachTC, tcx: false, want: AttachTC},
		{mode: AttachTC, probeErr: errProbe, want: AttachTC}, // no probe needed
		{mode: AttachAuto, probeErr: errProbe, err: "probe failed"},
	} {
		got, err := resolveAttach(c.mode, func() (bool, error) { return c.tcx, c.probeErr })
		if got != c.want || (err == nil) != (c.err == "") || err != nil && err.Error() != c.err {
			t.Errorf("--datapath-attach=%s, tcx %v, probe error %v: %q, %v; want %q, %q", c.mode, c.tcx, c.probeErr, got, err, c.want, c.err)
		}
	}
}
