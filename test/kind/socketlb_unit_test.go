// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"net"
	"testing"
)

// The parsing behind TestKindCilium's socket-LB scope, without a cluster.
func TestCgroup2Root(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, want string
		ok                    bool
	}{
		{"hybrid", "30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "/sys/fs/cgroup/unified", true},
		{"v2", "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n", "/sys/fs/cgroup", true},
		{"a subtree only", "40 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", "", false},
		{"none", "30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "", false},
	} {
		got, ok := cgroup2Root(tc.mountinfo)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: cgroup2Root = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func TestNsRoot(t *testing.T) {
	for _, tc := range []struct {
		name, outside, inside, want string
	}{
		{"init moved to init.scope", "9:name=systemd:/docker/abc\n0::/docker/abc/init.scope\n", "9:name=systemd:/\n0::/init.scope\n", "/docker/abc"},
		{"init at the root", "0::/docker/abc\n", "0::/\n", "/docker/abc"},
		{"the machine's namespace", "0::/init.scope\n", "0::/init.scope\n", ""},
		{"the machine's root", "0::/\n", "0::/\n", ""},
		{"paths that disagree", "0::/docker/abc/x\n", "0::/y\n", ""},
		{"no cgroup v2", "4:memory:/docker/abc\n", "4:memory:/\n", ""},
	} {
		got, err := nsRoot(tc.outside, tc.inside)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("%s: nsRoot = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

func TestProcNetAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100600A:01BB": "10.96.0.1:443",
		"0100007F:1F90": "127.0.0.1:8080",
		"00000000:0000": "0.0.0.0:0",
		"0100600A":      "",
		"XX00600A:01BB": "",
	} {
		got, err := procNetAddr(in)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("procNetAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// kernelPeer finds a real socket's destination.
func TestKernelPeer(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := kernelPeer(c.LocalAddr().String()); err != nil || got != l.Addr().String() {
		t.Errorf("kernelPeer(%s) = %q, %v; want %s", c.LocalAddr(), got, err, l.Addr())
	}
}
