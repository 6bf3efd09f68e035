// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Socket-LB in the Cilium tier (cilium/values.yaml): kube-proxy replacement
// turns it on whatever socketLB.enabled says, and its programs attach to the
// root of the cgroup2 mount the chart's mount-cgroup init container makes in
// the node's cgroup namespace. kind runs its nodes with --cgroupns=private,
// so that root is the node container's own cgroup: socket-LB translates the
// connect() of that node's processes and of no other process of the machine.
// With socketLB.hostNamespaceOnly, only those in the node's own network
// namespace; the pods' flows are balanced per packet.

// checkSocketLBScope asserts where socket-LB applies, from the kernel's
// attachments and from real connections to the kubernetes Service:
//   - on each node, Cilium reports socket-LB enabled for the host namespace
//     only;
//   - seen from the machine (bpftool on the host), Cilium's connect4
//     program is attached at each node container's cgroup-namespace root,
//     and none applies to the test's own process nor to the root of the
//     machine's cgroup2 hierarchy;
//   - a connect() from the machine to the kubernetes ClusterIP is not
//     translated (it fails, though its backend, the API server on the
//     control-plane node, answers the machine directly, or its socket's
//     destination is still the ClusterIP), and the same connect() from each
//     node's network namespace is (its socket's destination is the API
//     server).
func (c *cluster) checkSocketLBScope(t *testing.T) {
	t.Helper()
	status := regexp.MustCompile(`(?m)^\s*Socket LB:\s+Enabled\s*$`)
	coverage := regexp.MustCompile(`(?m)^\s*Socket LB Coverage:\s+Hostns-only\s*$`)
	for nodeName, pod := range c.ciliumPods(t) {
		out := c.ciliumDbg(t, pod, "status", "--verbose")
		if !status.MatchString(out) || !coverage.MatchString(out) {
			t.Errorf("cilium-dbg status --verbose on %s: want Socket LB Enabled, Coverage Hostns-only:\n%s", nodeName, out)
		}
	}

	mnt := cgroup2Mount(t)
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	ownPath, ok := cgroupV2Path(string(own))
	if !ok {
		t.Fatalf("/proc/self/cgroup has no cgroup v2 line:\n%s", own)
	}
	for _, p := range []struct{ what, path, mode string }{
		{"the root of the machine's cgroup2 hierarchy", mnt, ""},
		{"the test's own process", path.Join(mnt, ownPath), "effective"},
	} {
		if progs := c.cgroupProgs(t, p.path, p.mode); hasProg(progs, "cil_sock") {
			t.Errorf("Cilium's socket-LB applies to %s (%s): %+v", p.what, p.path, progs)
		}
	}
	for _, n := range c.nodes {
		root := c.nodeCgroupRoot(t, n)
		progs := c.cgroupProgs(t, path.Join(mnt, root), "")
		t.Logf("%s: cgroup-namespace root %s; programs attached there: %+v", n.name, root, progs)
		if !hasProg(progs, "cil_sock4_conn") {
			t.Errorf("%s: Cilium's connect4 program is not attached at the node's cgroup-namespace root %s: %+v", n.name, root, progs)
		}
	}

	var svc struct{ Spec struct{ ClusterIP string } }
	c.kubectlJSON(t, &svc, "-n", "default", "get", "service", "kubernetes", "-o", "json")
	clusterIP := net.JoinHostPort(svc.Spec.ClusterIP, "443")
	var apiServer string
	for _, n := range c.nodes {
		if n.name == c.name+"-control-plane" {
			apiServer = net.JoinHostPort(n.ip, "6443")
		}
	}
	if conn, err := net.DialTimeout("tcp", apiServer, 5*time.Second); err != nil {
		t.Errorf("the API server %s does not answer the machine: %v", apiServer, err)
	} else {
		conn.Close()
	}
	// A connection is no sign of translation (this machine's network may
	// answer any address); the destination the kernel holds for the socket
	// is (getpeername is socket-LB's too, and says the service address).
	if conn, err := net.DialTimeout("tcp", clusterIP, 3*time.Second); err != nil {
		// Translated, it would have reached the API server, which answers.
		t.Logf("from the machine, %s is not translated: %v", clusterIP, err)
	} else {
		peer, err := kernelPeer(conn.LocalAddr().String())
		conn.Close()
		switch {
		case err != nil:
			t.Error(err)
		case peer != clusterIP:
			t.Errorf("a connect() from the machine to the kubernetes Service %s went to %s: socket-LB translates the machine's processes", clusterIP, peer)
		default:
			t.Logf("from the machine, %s is not translated: the socket's destination is %s", clusterIP, peer)
		}
	}
	for _, n := range c.nodes {
		script := fmt.Sprintf(`exec 3<>/dev/tcp/%s/443 && ss -Htnp state established | grep -F "pid=$$,fd=3)"`, svc.Spec.ClusterIP)
		out, err := c.run("docker", "exec", n.name, "timeout", "10", "bash", "-c", script)
		if err != nil || !slices.Contains(strings.Fields(out), apiServer) {
			t.Errorf("from %s's network namespace, a connect() to %s did not go to the API server %s: %v %s", n.name, clusterIP, apiServer, err, out)
			continue
		}
		t.Logf("from %s's network namespace, %s is translated: %s", n.name, clusterIP, strings.TrimSpace(out))
	}
}

// kernelPeer is the remote address the kernel holds for this process's
// TCP socket bound to local (/proc/self/net/tcp, IPv4).
func kernelPeer(local string) (string, error) {
	b, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		if addr, err := procNetAddr(f[1]); err == nil && addr == local {
			return procNetAddr(f[2])
		}
	}
	return "", fmt.Errorf("no socket of %s in /proc/self/net/tcp", local)
}

// procNetAddr decodes an address of /proc/net/tcp: the IPv4 address as a
// hexadecimal number in the host's (little-endian) byte order, the port in
// hexadecimal.
func procNetAddr(s string) (string, error) {
	h, p, ok := strings.Cut(s, ":")
	ip, err1 := strconv.ParseUint(h, 16, 32)
	port, err2 := strconv.ParseUint(p, 16, 16)
	if !ok || len(h) != 8 || err1 != nil || err2 != nil {
		return "", fmt.Errorf("/proc/net/tcp address %q", s)
	}
	a := netip.AddrFrom4([4]byte{byte(ip), byte(ip >> 8), byte(ip >> 16), byte(ip >> 24)})
	return netip.AddrPortFrom(a, uint16(port)).String(), nil
}

// cgroup2Mount is where the machine's cgroup2 hierarchy is mounted, its
// root: /sys/fs/cgroup (cgroup v2), /sys/fs/cgroup/unified (hybrid).
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	mnt, ok := cgroup2Root(string(b))
	if !ok {
		t.Fatalf("no cgroup2 mount of the hierarchy's root in /proc/self/mountinfo:\n%s", b)
	}
	return mnt
}

// cgroup2Root is the mount point of a mount of the cgroup2 hierarchy's
// root in mountinfo (proc_pid_mountinfo(5)).
func cgroup2Root(mountinfo string) (string, bool) {
	for _, l := range strings.Split(mountinfo, "\n") {
		// id parent major:minor root mountpoint options... - type source ...
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(g) >= 1 && g[0] == "cgroup2" && f[3] == "/" {
			return f[4], true
		}
	}
	return "", false
}

// cgroupV2Path is the cgroup v2 path of a /proc/<pid>/cgroup: its "0::"
// line, in the reader's cgroup namespace.
func cgroupV2Path(procCgroup string) (string, bool) {
	for _, l := range strings.Split(procCgroup, "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, true
		}
	}
	return "", false
}

// nodeCgroupRoot is the root of node n's cgroup namespace in the machine's
// cgroup2 hierarchy (nsRoot of its init's /proc/<pid>/cgroup read from the
// machine and from the node).
func (c *cluster) nodeCgroupRoot(t *testing.T, n node) string {
	t.Helper()
	pid := strings.TrimSpace(c.must(t, "docker", "inspect", "-f", "{{.State.Pid}}", n.name))
	outside, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	root, err := nsRoot(string(outside), c.must(t, "docker", "exec", n.name, "cat", "/proc/1/cgroup"))
	if err != nil {
		t.Fatalf("%s: %v", n.name, err)
	}
	return root
}

// nsRoot is the root of a process's cgroup namespace in the cgroup2
// hierarchy: its cgroup seen from outside the namespace less the same seen
// from inside. The hierarchy's own root means the namespace is the
// machine's, and socket-LB would apply to every process of the machine.
func nsRoot(outside, inside string) (string, error) {
	o, ok1 := cgroupV2Path(outside)
	i, ok2 := cgroupV2Path(inside)
	if !ok1 || !ok2 {
		return "", fmt.Errorf("no cgroup v2 line in its init's cgroups seen from the machine:\n%s\nor from inside:\n%s", outside, inside)
	}
	root := o
	if i != "/" {
		var found bool
		if root, found = strings.CutSuffix(o, i); !found {
			return "", fmt.Errorf("its init is in %s seen from the machine, %s from inside", o, i)
		}
	}
	if root == "" || root == "/" {
		return "", fmt.Errorf("shares the machine's cgroup namespace (its init is in %s from both sides): Cilium's socket-LB would attach to the root of the machine's cgroup2 hierarchy", o)
	}
	return root, nil
}

type cgroupProg struct {
	ID         int    `json:"id"`
	AttachType string `json:"attach_type"`
	Name       string `json:"name"`
}

// cgroupProgs are the BPF programs attached to the cgroup at dir (mode "")
// or applying to it (mode "effective"), by the machine's bpftool.
func (c *cluster) cgroupProgs(t *testing.T, dir, mode string) []cgroupProg {
	t.Helper()
	args := []string{"-j", "cgroup", "show", dir}
	if mode != "" {
		args = append(args, mode)
	}
	out := strings.TrimSpace(c.must(t, "bpftool", args...))
	var progs []cgroupProg
	if out != "" {
		if err := json.Unmarshal([]byte(out), &progs); err != nil {
			t.Fatalf("bpftool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return progs
}

// hasProg: a program whose name starts with prefix. Cilium's socket-LB
// programs are cil_sock*; its translation of connect() cil_sock4_connect
// (bpftool may show the kernel's 15-byte name).
func hasProg(progs []cgroupProg, prefix string) bool {
	for _, p := range progs {
		if strings.HasPrefix(p.Name, prefix) {
			return true
		}
	}
	return false
}

// nodeProbe opens n new flows to vip from node nd's own network namespace
// (l4xds-traffic copied into the node by cilium/run.sh): socket-LB's.
func (c *cluster) nodeProbe(nd node, vip, proto string, n int) (probeResult, error) {
	var r probeResult
	out, err := exec.Command("docker", "exec", nd.name, "l4xds-traffic", "probe", "--to", vip, "--proto", proto,
		"--flows", fmt.Sprint(n), "--timeout", c.timeout(), "-o", "json").Output()
	// Exit status 1: some flows failed, and the report says which.
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != 1) {
		return r, fmt.Errorf("probe from %s %s/%s: %w %s", nd.name, vip, proto, err, out)
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("probe from %s %s/%s: %w: %s", nd.name, vip, proto, err, out)
	}
	return r, nil
}
