// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// isolatedEnv marks the test binary Main re-executed in namespaces of its own.
const isolatedEnv = "L4XDS_TEST_ISOLATED"

// Main runs the tests of a package that uses the network, as root, in
// network, mount and PID namespaces of their own, so that no result
// depends on the host's forwarding, routes, rp_filter, bridges or firewall,
// and nothing the tests make outlives them: their namespaces, mounts and
// processes go with the last process of the PID namespace, however the run
// ends (a timeout, SIGKILL). Call it from TestMain. Not root, the tests run
// as they are (the privileged ones skip).
//
// The test binary runs itself again, as PID 1 of the new namespaces:
//   - its network namespace has lo up, no other device or route, and
//     forwarding off (set explicitly: a new namespace inherits the host's
//     IPv4 settings);
//   - its mount namespace is private, with its own /proc (of the new PID
//     namespace) and /run/netns (the namespaces tests name with ip netns
//     add), and the bpffs tests mount: none of the host's, which may be
//     another test's that goes at any moment (Cilium's code outside its
//     agent pins where the first bpffs it finds is).
func Main(m *testing.M) {
	switch {
	case os.Geteuid() != 0, fuzzWorker():
		// A fuzzing worker runs where its coordinator started it: in the
		// namespaces already made (and with the pipes to the coordinator,
		// which a re-executed binary would not have).
		os.Exit(m.Run())
	case os.Getenv(isolatedEnv) == "1" && os.Getpid() == 1:
		// Not for what the tests run: a test binary they start sets up
		// namespaces of its own.
		os.Unsetenv(isolatedEnv)
		if err := setUpIsolated(); err != nil {
			fmt.Fprintf(os.Stderr, "netns: setting up the tests' namespaces: %v\n", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	}
	os.Exit(runIsolated())
}

// fuzzWorker says whether the binary runs as a worker of go test -fuzz.
func fuzzWorker() bool {
	for _, a := range os.Args[1:] {
		if a == "-test.fuzzworker" || strings.HasPrefix(a, "-test.fuzzworker=") {
			return true
		}
	}
	return false
}

// runIsolated runs the test binary again in new namespaces and returns its
// exit code.
func runIsolated() int {
	// The child is killed when the thread that started it ends: this one,
	// which is the process's until it exits.
	runtime.LockOSThread()
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	// Signals for the tests (an interrupt, go test's SIGQUIT on a timeout)
	// go on to them.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "netns: running the tests in namespaces of their own: %v\n", err)
		return 1
	}
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	}
	fmt.Fprintf(os.Stderr, "netns: the tests in namespaces of their own: %v\n", err)
	return 1
}

// Sysctls of the tests' own network namespace: a host, not a router.
var isolatedSysctls = []string{
	"net.ipv4.ip_forward=0",
	"net.ipv6.conf.all.forwarding=0",
	"net.ipv4.conf.all.rp_filter=0",
	"net.ipv4.conf.default.rp_filter=0",
}

func setUpIsolated() error {
	// Nothing mounted here reaches the host's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := detachBPFFS(); err != nil {
		return err
	}
	// The PID namespace's own /proc: ip netns pids, /proc/self and the
	// pids the tests kill mean the same processes. /proc/sys/net is this
	// network namespace's.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", runDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mount %s: %w", runDir, err)
	}
	if err := writeSysctls(isolatedSysctls...); err != nil {
		return err
	}
	return ip("link", "set", "lo", "up")
}

// runDir is where ip netns add names namespaces.
const runDir = "/run/netns"

// detachBPFFS unmounts, in this private mount namespace, every bpffs it
// inherited from the host.
func detachBPFFS() error {
	points, err := Mounts("bpf", "")
	if err != nil {
		return err
	}
	// The last mounted first: one may be mounted over another.
	for _, p := range slices.Backward(points) {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount the host's bpffs %s: %w", p, err)
		}
	}
	return nil
}
