// SPDX-License-Identifier: Apache-2.0

package agenttest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// hostSysctls are the host-wide settings the agent would change if it
// could (Cilium's loader writes them, ignoring failures): they must read
// the same after the test.
var hostSysctls = []string{
	"kernel/unprivileged_bpf_disabled",
	"kernel/timer_migration",
	"net/core/bpf_jit_enable",
	"net/core/fb_tunnels_only_for_init_net",
}

// hostState is what the host looked like before Start; check compares.
type hostState struct {
	sysctls  map[string]string
	cg2Root  string
	cg2Progs string // `bpftool cgroup show` of the cgroup2 root
}

func readHostState() (hostState, error) {
	h := hostState{sysctls: map[string]string{}}
	for _, k := range hostSysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if errors.Is(err, os.ErrNotExist) {
			continue // not in this kernel
		}
		if err != nil {
			return h, err
		}
		h.sysctls[k] = strings.TrimSpace(string(b))
	}
	cg2, err := netns.Mounts("cgroup2", "")
	if err != nil {
		return h, err
	}
	if len(cg2) == 0 {
		return h, errors.New("no cgroup2 mount in the host: the agent's socket-LB needs one (a cgroup v2 or hybrid host)")
	}
	h.cg2Root = cg2[0]
	if h.cg2Progs, err = cgroupPrograms(h.cg2Root); err != nil {
		return h, err
	}
	return h, nil
}

// check reports every way the host differs from h, or still holds what
// e made. Other tests may mount and unmount their own bpffs meanwhile, so
// the mounts checked are e's: every one under its directory, which holds
// the bpffs, the tmpfs and the bind mounts of the agent's namespace.
func (h hostState) check(e *Env) error {
	var errs []error
	for k, v := range h.sysctls {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			errs = append(errs, err)
		} else if now := strings.TrimSpace(string(b)); now != v {
			errs = append(errs, fmt.Errorf("sysctl %s is %s, was %s", strings.ReplaceAll(k, "/", "."), now, v))
		}
	}
	if m, err := netns.Mounts("", e.dir); err != nil {
		errs = append(errs, err)
	} else if len(m) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %q", m))
	}
	if p, err := cgroupPrograms(h.cg2Root); err != nil {
		errs = append(errs, err)
	} else if p != h.cg2Progs {
		errs = append(errs, fmt.Errorf("programs on the cgroup2 root %s are\n%s\nwere\n%s", h.cg2Root, p, h.cg2Progs))
	}
	if _, err := os.Stat(e.cgroup); err == nil {
		errs = append(errs, fmt.Errorf("cgroup %s is still there", e.cgroup))
	}
	for _, ns := range []string{e.Client, e.Node, e.Backends} {
		if _, err := os.Stat("/run/netns/" + ns); err == nil {
			errs = append(errs, fmt.Errorf("network namespace %s is still there", ns))
		}
	}
	e.mu.Lock()
	if e.agent != nil && !e.agent.Exited() {
		errs = append(errs, fmt.Errorf("cilium-agent (pid %d) still runs", e.agent.Cmd.Process.Pid))
	}
	e.mu.Unlock()
	return errors.Join(errs...)
}

// cgroupPrograms is `bpftool cgroup show DIR`: the programs attached to
// that cgroup itself.
func cgroupPrograms(dir string) (string, error) {
	out, err := exec.Command("bpftool", "cgroup", "show", dir).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("bpftool cgroup show %s: %w: %s (apt-get install bpftool)", dir, err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// createCgroup makes the child cgroup that confines the agent, and
// registers its removal.
func (e *Env) createCgroup() error {
	b := make([]byte, 4)
	rand.Read(b)
	e.cg2Root = e.host.cg2Root
	e.cgroup = filepath.Join(e.cg2Root, "l4xds-agenttest-"+hex.EncodeToString(b))
	if err := os.Mkdir(e.cgroup, 0o755); err != nil {
		return fmt.Errorf("create child cgroup: %w", err)
	}
	e.onCleanup(e.removeCgroup)
	return nil
}

// removeCgroup removes the child cgroup once it is empty. Its processes
// are the agent (stopped before) and what it or the test started in it,
// which end with them: their list is only waited on, never used to kill.
func (e *Env) removeCgroup() error {
	var dirs []string
	filepath.WalkDir(e.cgroup, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	// Deepest first.
	slices.Reverse(dirs)
	deadline := time.Now().Add(15 * time.Second)
	for _, d := range dirs {
		for {
			err := os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				return fmt.Errorf("remove cgroup %s: %w (processes: %s)", d, err, strings.Fields(string(procs)))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// ciliumBPFDir is the bpf/ directory of the github.com/cilium/cilium module
// this module builds against.
func ciliumBPFDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/cilium/cilium").Output()
	if err != nil {
		return "", fmt.Errorf("find the github.com/cilium/cilium module (go list -m): %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "bpf")
	if _, err := os.Stat(filepath.Join(dir, "bpf_host.c")); err != nil {
		return "", fmt.Errorf("Cilium's bpf sources: %w (go mod download github.com/cilium/cilium)", err)
	}
	return dir, nil
}

// llvmDir is where a clang for Cilium's datapath is: $L4XDS_LLVM_BIN, or
// the directory of clang-19's real binary (distributions install LLVM
// versions side by side and link clang-N into PATH), or "" for PATH's.
func llvmDir() string {
	if d := os.Getenv("L4XDS_LLVM_BIN"); d != "" {
		return d
	}
	p, err := exec.LookPath("clang-19")
	if err != nil {
		return ""
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return ""
	}
	dir := filepath.Dir(real)
	if _, err := os.Stat(filepath.Join(dir, "clang")); err != nil {
		return ""
	}
	return dir
}
