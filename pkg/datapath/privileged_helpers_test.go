// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/l4xds/l4xds/test/netns"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a BPF filesystem, loads BPF programs and creates network devices")
	}
}

// bpffs mounts a BPF filesystem in a temporary directory for the test.
func bpffs(t *testing.T) string { return netns.MountBPFFS(t) }

// testDevice creates a veth pair with a unique name, deleted when the test
// ends (which also detaches what is attached to it). (Veth rather than
// dummy: kernels without modules may lack the dummy driver.)
func testDevice(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := "l4xt" + hex.EncodeToString(b) // 12 of IFNAMSIZ-1, "p" for the peer
	for _, args := range [][]string{
		{"link", "add", name, "type", "veth", "peer", "name", name + "p"},
		{"link", "set", name, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip link del %s: %v\n%s", name, err, out)
		}
	})
	return name
}

// tcxIngress lists the programs attached at the device's tcx ingress.
func tcxIngress(t *testing.T, dev string) []link.AttachedProgram {
	t.Helper()
	iface, err := net.InterfaceByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: iface.Index, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		if tcx, probeErr := haveTCX(); probeErr == nil && !tcx {
			return nil // a kernel without tcx: nothing is attached with it
		}
		t.Fatalf("query tcx ingress of %s: %v", dev, err)
	}
	return res.Programs
}

// logBuffer is a logger whose output the test reads, and prints if it
// fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func testLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// eventually polls cond until it holds, failing the test after a generous
// deadline (never an assertion on timing).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
