// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Add creates a network namespace with lo up and the sysctl settings given
// (key=value: net.ipv4.ip_forward=1), deleted when tb ends. A new
// namespace inherits the IPv4 settings of the host's: a test sets what it
// relies on.
func Add(tb testing.TB, settings ...string) string {
	tb.Helper()
	ns := UniquePrefix()
	if err := ip("netns", "add", ns); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		killPIDs(ns)
		if err := ip("netns", "delete", ns); err != nil {
			tb.Error(err)
		}
	})
	if err := ip("-n", ns, "link", "set", "lo", "up"); err != nil {
		tb.Fatal(err)
	}
	if len(settings) > 0 {
		if err := sysctl(ns, settings...); err != nil {
			tb.Fatal(err)
		}
	}
	return ns
}

// IP runs ip(8) with args (-n NS for a namespace), failing tb on error.
func IP(tb testing.TB, args ...string) {
	tb.Helper()
	if err := ip(args...); err != nil {
		tb.Fatal(err)
	}
}

// Do runs fn on the calling goroutine with its OS thread in namespace ns:
// what the thread does in the kernel (BPF_PROG_RUN's FIB lookup, opening
// /proc/sys/net, sockets) is ns's. fn may end the test (t.Fatal): the
// thread goes back all the same.
func Do(tb testing.TB, ns string, fn func()) {
	tb.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		tb.Fatal(err)
	}
	defer orig.Close()
	target, err := os.Open(filepath.Join(runDir, ns))
	if err != nil {
		runtime.UnlockOSThread()
		tb.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		tb.Fatalf("enter %s: %v", ns, err)
	}
	defer func() {
		// A thread that cannot go back stays locked: Go ends it with the
		// goroutine instead of reusing it.
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			tb.Errorf("leave %s: %v", ns, err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn()
}

// Sysctl reads a setting (net.ipv4.ip_forward) of the calling thread's
// network namespace: the test's own, or ns's inside Do.
func Sysctl(key string) (string, error) {
	b, err := os.ReadFile("/proc/sys/" + strings.ReplaceAll(key, ".", "/"))
	return strings.TrimSpace(string(b)), err
}

// writeSysctls writes key=value settings of the calling thread's network
// namespace.
func writeSysctls(settings ...string) error {
	for _, kv := range settings {
		k, v, _ := strings.Cut(kv, "=")
		if err := os.WriteFile("/proc/sys/"+strings.ReplaceAll(k, ".", "/"), []byte(v), 0); err != nil {
			return fmt.Errorf("sysctl %s: %w", kv, err)
		}
	}
	return nil
}
