// SPDX-License-Identifier: Apache-2.0

// Package agenttest runs the real cilium-agent in namespaces of its own, with
// real packets through it, for privileged tests:
//
//	client ns            node ns (the agent)              backends ns
//	10.0.0.2 eth0 ═══ eth0 10.0.0.1   eth1 192.168.1.1 ═══ eth0 192.168.1.10, .11, ...
//
// The client and the backends route through the node, where the agent's
// datapath attaches to both devices (a backend's reply enters eth1 and is
// reverse-NATed there). Start builds the topology, starts the agent confined
// (see Start), waits until its API answers and registers a cleanup that
// leaves the host as it was found.
//
// Using it for the xDS control plane: the agent binary built in this module
// carries our xDS cell, so a test passes the cell's flags in Config.Flags in
// place of --lb-state-file, and starts the control plane in the client
// namespace (10.0.0.2, which the node reaches on eth0) from
// Config.BeforeAgent, so that it listens before the agent dials it:
//
//	env := agenttest.Start(t, agenttest.Config{
//		BinDir: dir,
//		BeforeAgent: func(e *agenttest.Env) error {
//			_, err := e.StartProc(e.Client, controlPlane, "--listen=10.0.0.2:18000", ...)
//			return err
//		},
//		Flags: []string{
//			"--enable-xds-control-plane",
//			"--xds-server-address=10.0.0.2:18000",
//			"--xds-client-cert-path=" + cert, "--xds-client-key-path=" + key,
//			"--xds-ca-cert-path=" + ca, "--xds-server-name=control-plane",
//			"--bpf-lb-algorithm=maglev",
//		},
//	})
//
// The rest is as in TestPrivilegedCiliumFileSource: backends with
// StartBackend, flows with RunProbe, the agent's tables with Shell.
//
// Files the agent reads (certificates, state files) can live anywhere in the
// test's temporary directory: the agent's mount namespace sees the host's
// file systems, except the few private mounts listed in Start.
package agenttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// Devices of the node namespace.
const (
	// ClientDevice faces the client.
	ClientDevice = "eth0"
	// BackendDevice faces the backends; it is the direct-routing device.
	BackendDevice = "eth1"
)

// Addresses of the topology.
var (
	ClientIP      = netip.MustParseAddr("10.0.0.2")
	NodeClientIP  = netip.MustParseAddr("10.0.0.1")
	NodeBackendIP = netip.MustParseAddr("192.168.1.1")
)

// BackendIP is the address of backend i in the backends namespace.
func BackendIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{192, 168, 1, byte(10 + i)}) }

// Config says which agent to run and how.
type Config struct {
	// BinDir holds cilium-agent and cilium-dbg.
	BinDir string
	// BPFDir is Cilium's bpf/ source directory, which the agent compiles at
	// start-up; "" finds it in the github.com/cilium/cilium module.
	BPFDir string
	// LLVMDir is put first on the agent's PATH so that it finds a clang
	// recent enough for Cilium's datapath; "" uses $L4XDS_LLVM_BIN, or the
	// directory of clang-19 when that is installed, or else PATH as it is.
	LLVMDir string
	// Backends is the number of backend addresses (BackendIP(0) ...); 0
	// means 2.
	Backends int
	// Flags are added to the agent's command line after the ones that fit
	// the topology (DefaultFlags), so they can override them.
	Flags []string
	// BeforeAgent, when set, runs once the namespaces exist and before the
	// agent starts: to start what the agent connects to at start-up (an
	// xDS control plane) with Env.StartProc.
	BeforeAgent func(*Env) error
	// ReadyTimeout bounds the wait for the agent's API to report it healthy;
	// 0 means 5 minutes (it compiles its datapath first, slowly on a busy
	// machine).
	ReadyTimeout time.Duration
}

// Env is a running topology and agent.
type Env struct {
	tb  testing.TB
	cfg Config

	// Network namespaces.
	Client, Node, Backends string
	// BackendIPs are the backends' addresses, all in Backends.
	BackendIPs []netip.Addr

	dir     string // private temporary directory of this Env
	runDir  string // a tmpfs, the agent's /var/run (state, API sockets)
	bpffs   string // the agent's bpffs, mounted here in the host
	libDir  string // the agent's --lib-dir; bpf/ is bind-mounted in its namespace
	cgroup  string // the child cgroup that confines the agent (host path)
	cg2Root string // the cgroup2 mount of the host
	path    string // the agent's PATH

	mu        sync.Mutex
	nextPort  int // the first source port of RunProbe's next probe of several flows
	agent     *netns.Proc
	agentLogs []string // output of agents stopped before
	started   time.Time
	host      hostState
	cleanups  []func() error // undo steps, run last first
	cleaned   bool           // the cleanup has begun: start nothing more
	cleanDone chan struct{}  // closed when the cleanup has ended
	stopSig   func()
}

// Start creates the topology, starts the agent and waits for its API to
// report it healthy. It skips the test when not root. Everything it creates
// is removed when the test ends, and also when the test process gets
// SIGINT or SIGTERM.
//
// The agent runs confined so that its host-wide effects stay in the test:
//   - in the node network namespace (`ip netns exec`, which also gives it a
//     private mount namespace with a sysfs of that network namespace);
//   - in a child cgroup of the host's cgroup2 hierarchy and a cgroup
//     namespace rooted there: --cgroup-root is an unmounted directory on its
//     private /var/run, so the agent mounts cgroup2 there itself and gets
//     that child as root, and socket-LB attaches to the child only (with the
//     host's cgroup2 mount as --cgroup-root it would mount the root over it
//     and attach to every process of the machine);
//   - with its own bpffs on /sys/fs/bpf (and --bpf-root), its own tmpfs on
//     /var/run (--state-dir and the API sockets are there) and a private
//     --lib-dir with Cilium's bpf/ sources bind-mounted in;
//   - with /proc/sys/kernel read-only, so that its host-wide sysctls
//     (kernel.unprivileged_bpf_disabled, kernel.timer_migration) fail, as
//     Cilium allows.
//
// The bpffs and the tmpfs are mounted in the host, under the test's
// temporary directory, so that Restart finds the pinned maps and the state
// of the previous run, as an agent restarted on a node does.
func Start(tb testing.TB, cfg Config) *Env {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: runs cilium-agent in network, mount and cgroup namespaces")
	}
	if cfg.BinDir == "" {
		tb.Fatal("agenttest: Config.BinDir is empty")
	}
	for _, b := range []string{"cilium-agent", "cilium-dbg"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			tb.Fatalf("agenttest: %v", err)
		}
	}
	if cfg.Backends == 0 {
		cfg.Backends = 2
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 5 * time.Minute
	}
	prefix := netns.UniquePrefix()
	e := &Env{tb: tb, cfg: cfg, dir: tb.TempDir(), cleanDone: make(chan struct{}),
		Client: prefix + "-client", Node: prefix + "-node", Backends: prefix + "-backends"}
	for i := range cfg.Backends {
		e.BackendIPs = append(e.BackendIPs, BackendIP(i))
	}
	var err error
	if e.host, err = readHostState(); err != nil {
		tb.Fatalf("agenttest: %v", err)
	}
	// Registered before anything is created: a failure half-way is undone
	// too.
	tb.Cleanup(e.cleanup)
	e.stopSig = e.cleanupOnSignal()
	if err := e.setUp(); err != nil {
		tb.Fatalf("agenttest: %v", err)
	}
	if cfg.BeforeAgent != nil {
		if err := cfg.BeforeAgent(e); err != nil {
			tb.Fatalf("agenttest: before the agent: %v", err)
		}
	}
	if err := e.startAgent(); err != nil {
		tb.Fatalf("agenttest: %v", err)
	}
	return e
}

// setUp prepares everything but the agent.
func (e *Env) setUp() error {
	var err error
	if e.cfg.BPFDir == "" {
		if e.cfg.BPFDir, err = ciliumBPFDir(); err != nil {
			return err
		}
	}
	llvm := e.cfg.LLVMDir
	if llvm == "" {
		llvm = llvmDir()
	}
	e.path = os.Getenv("PATH")
	if llvm != "" {
		e.path = llvm + ":" + e.path
	}
	if err := checkTools(e.path); err != nil {
		return err
	}
	if err := e.createTopology(); err != nil {
		return err
	}
	e.runDir = filepath.Join(e.dir, "run")
	if err := e.mount("tmpfs", e.runDir, "tmpfs", "mode=0755"); err != nil {
		return err
	}
	e.bpffs = filepath.Join(e.dir, "bpffs")
	if err := e.mount("bpf", e.bpffs, "bpf", ""); err != nil {
		return err
	}
	// The agent's $HOME, where Go tools it embeds write (gops).
	if err := os.Mkdir(filepath.Join(e.dir, "home"), 0o700); err != nil {
		return err
	}
	e.libDir = filepath.Join(e.dir, "lib")
	if err := os.MkdirAll(filepath.Join(e.libDir, "bpf"), 0o755); err != nil {
		return err
	}
	return e.createCgroup()
}

// tools are the programs the agent (clang, iptables, ipset) and the
// launcher (ip, mount, bpftool) run, with the Debian packages that have
// them.
var tools = map[string]string{
	"clang": "clang-19", "llc": "llvm-19", "iptables": "iptables", "ipset": "ipset",
	"ip": "iproute2", "mount": "mount", "bpftool": "bpftool",
}

// checkTools tells up front which tools are missing from PATH, rather than
// let the agent fail on them later.
func checkTools(path string) error {
	var missing []string
	for tool, pkg := range tools {
		found := false
		for _, dir := range filepath.SplitList(path) {
			if fi, err := os.Stat(filepath.Join(dir, tool)); err == nil && !fi.IsDir() {
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, tool+" ("+pkg+")")
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("missing on PATH: %s (apt-get install the packages named)", strings.Join(missing, ", "))
	}
	return nil
}

// mount mounts a file system on a new directory and registers its unmount.
func (e *Env) mount(source, dir, fstype, data string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := syscall.Mount(source, dir, fstype, 0, data); err != nil {
		return fmt.Errorf("mount -t %s %s: %w", fstype, dir, err)
	}
	e.onCleanup(func() error {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", dir, err)
		}
		return nil
	})
	return nil
}

func (e *Env) onCleanup(f func() error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

// DefaultFlags are the agent flags that fit the topology: no Kubernetes,
// kube-proxy replacement on both node devices (replies from the backends
// enter eth1 and are reverse-NATed only when it is listed), native routing,
// and the private paths of the confinement. Config.Flags come after them.
func (e *Env) DefaultFlags() []string {
	return []string{
		"--enable-k8s=false",
		"--kube-proxy-replacement=true",
		"--install-iptables-rules=true",
		"--devices=" + ClientDevice + "," + BackendDevice,
		"--direct-routing-device=" + BackendDevice,
		"--routing-mode=native",
		"--ipv4-native-routing-cidr=10.244.0.0/16",
		"--ipv4-range=10.244.0.0/24",
		"--enable-ipv4=true",
		"--enable-ipv6=false",
		"--enable-health-checking=false",
		"--enable-endpoint-health-checking=false",
		"--enable-l7-proxy=false",
		// gops would listen in the node namespace, harmless, but leaves a
		// file per run in $HOME (which is private as well).
		"--enable-gops=false",
		"--lib-dir=" + e.libDir,
		"--state-dir=/var/run/cilium",
		"--bpf-root=/sys/fs/bpf",
		"--cgroup-root=/var/run/cilium/cgroupv2",
	}
}

// startAgent starts the agent confined (see Start) and waits until it is
// healthy.
func (e *Env) startAgent() error {
	// The mounts of the agent's private mount namespace, made by a shell
	// between `ip netns exec` (which unshares the mount namespace, with
	// slave propagation, so nothing made here reaches the host) and the
	// agent.
	script := strings.Join([]string{
		"mount --bind " + e.runDir + " /var/run",
		"mount --bind " + e.bpffs + " /sys/fs/bpf",
		"mount --bind " + e.cfg.BPFDir + " " + filepath.Join(e.libDir, "bpf"),
		"mount --bind /proc/sys/kernel /proc/sys/kernel",
		"mount -o remount,bind,ro /proc/sys/kernel",
		`exec "$@"`,
	}, "\n")
	args := []string{"netns", "exec", e.Node, "sh", "-ec", script, "sh",
		"env", "PATH=" + e.path, "HOME=" + filepath.Join(e.dir, "home"), filepath.Join(e.cfg.BinDir, "cilium-agent")}
	args = append(args, e.DefaultFlags()...)
	args = append(args, e.cfg.Flags...)
	cmd := exec.Command("ip", args...)
	cg, err := os.Open(e.cgroup)
	if err != nil {
		return err
	}
	defer cg.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Born in the child cgroup, then a cgroup namespace rooted there.
		UseCgroupFD:  true,
		CgroupFD:     int(cg.Fd()),
		Unshareflags: syscall.CLONE_NEWCGROUP,
		// Every step execs in place, so the agent is this process: it dies
		// with the test even when the test is killed.
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a ^C to the test reaches the test only,
		// whose cleanup then stops the agent in order.
		Setpgid: true,
	}
	// A child the agent left behind keeps its output open: stop reading
	// it then rather than wait for that child.
	cmd.WaitDelay = 5 * time.Second
	// Started under the lock: the cleanup, which may run on a signal while
	// the test goes on, either sees this agent or keeps it from starting.
	e.mu.Lock()
	if e.cleaned {
		e.mu.Unlock()
		return errCleanedUp
	}
	started := time.Now()
	p, err := netns.StartProc("cilium-agent", cmd)
	if err == nil {
		e.agent, e.started = p, started
	}
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("start cilium-agent: %w", err)
	}
	return e.waitReady(p, started)
}

// waitReady polls `cilium-dbg status` until agent p reports itself healthy.
func (e *Env) waitReady(p *netns.Proc, started time.Time) error {
	deadline := time.Now().Add(e.cfg.ReadyTimeout)
	var last string
	for {
		if p.Exited() {
			return fmt.Errorf("cilium-agent exited (%v) before it was ready", p.Cmd.ProcessState)
		}
		out, err := e.Dbg("status", "--brief")
		if err == nil {
			e.tb.Logf("cilium-agent ready after %s", time.Since(started).Round(100*time.Millisecond))
			return nil
		}
		last = out
		if time.Now().After(deadline) {
			return fmt.Errorf("cilium-agent not ready within %s: cilium-dbg status: %s", e.cfg.ReadyTimeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// Started is when the running agent was started: a test measures the time
// to its first answered flow from here.
func (e *Env) Started() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.started
}

// AgentPID is the running agent's process ID (every step of its start
// execs in place, so it is cilium-agent's own), 0 when none runs: a
// benchmark reads the agent's CPU time from /proc with it.
func (e *Env) AgentPID() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.agent == nil || e.agent.Cmd.Process == nil {
		return 0
	}
	return e.agent.Cmd.Process.Pid
}

// CgroupCPU is the CPU time the agent's cgroup has used so far: the agent
// and what it runs (clang compiling its datapath), from cpu.stat.
func (e *Env) CgroupCPU() (time.Duration, error) {
	path := filepath.Join(e.cgroup, "cpu.stat")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", path, err)
			}
			return time.Duration(us) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("%s: no usage_usec", path)
}

// AgentOutput is what the running agent printed so far.
func (e *Env) AgentOutput() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.agent == nil {
		return ""
	}
	return e.agent.Output()
}

// APISocket is the agent's API socket, as seen from the host.
func (e *Env) APISocket() string { return filepath.Join(e.runDir, "cilium", "cilium.sock") }

// ShellSocket is the agent's shell socket, as seen from the host.
func (e *Env) ShellSocket() string { return filepath.Join(e.runDir, "cilium", "shell.sock") }

// Dbg runs cilium-dbg against the agent's API socket and returns its
// combined output.
func (e *Env) Dbg(args ...string) (string, error) {
	return e.run(e.dbg(append([]string{"-H", "unix://" + e.APISocket()}, args...)...))
}

// Shell runs one command of the agent's shell: Shell("db/show",
// "frontends") is `cilium-dbg shell -- db/show frontends`.
func (e *Env) Shell(args ...string) (string, error) {
	return e.run(e.dbg(append([]string{"shell", "--shell-sock-path", e.ShellSocket(), "--"}, args...)...))
}

// StateDB is `cilium-dbg statedb dump`.
func (e *Env) StateDB() (string, error) { return e.Dbg("statedb", "dump") }

// BPF runs `cilium-dbg bpf ARGS...`: BPF("lb", "list") is `cilium-dbg bpf
// lb list`. The bpf subcommands open the pinned maps rather than asking the
// API, so it runs in the node namespace with the agent's bpffs on
// /sys/fs/bpf.
func (e *Env) BPF(args ...string) (string, error) {
	script := "mount --bind " + e.bpffs + ` /sys/fs/bpf && exec "$@"`
	args = append([]string{"netns", "exec", e.Node, "sh", "-ec", script, "sh",
		filepath.Join(e.cfg.BinDir, "cilium-dbg"), "bpf"}, args...)
	return e.run(exec.Command("ip", args...))
}

// dbg is a cilium-dbg command for this agent. Some subcommands (statedb)
// ignore -H and read the socket from $CILIUM_SOCK, so it gets both.
func (e *Env) dbg(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(e.cfg.BinDir, "cilium-dbg"), args...)
	cmd.Env = append(os.Environ(), "CILIUM_SOCK="+e.APISocket())
	return cmd
}

// run runs cmd for at most a minute and returns its combined output.
func (e *Env) run(cmd *exec.Cmd) (string, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	t := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	t.Stop()
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.String(), nil
}

// Command runs name in network namespace ns (e.Client, e.Node, e.Backends).
func (e *Env) Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	return netns.Command(ctx, ns, name, args...)
}

// StartProc starts name in namespace ns until the test ends (or Stop).
func (e *Env) StartProc(ns, name string, args ...string) (*netns.Proc, error) {
	cmd := netns.Command(context.Background(), ns, name, args...)
	cmd.WaitDelay = 5 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// As the agent: started under the lock, or not once cleaned up.
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cleaned {
		return nil, errCleanedUp
	}
	p, err := netns.StartProc(filepath.Base(name)+"@"+ns, cmd)
	if err != nil {
		return nil, err
	}
	e.cleanups = append(e.cleanups, func() error { p.Stop(); return nil })
	return p, nil
}

// errCleanedUp refuses to start a process after the cleanup (on a signal,
// while the test goes on).
var errCleanedUp = errors.New("agenttest: the environment is cleaned up")

// OutputInAgentCgroup runs name to completion in the node namespace inside
// the agent's cgroup (a child of it, so that the agent's own cgroup holds
// only the agent) and returns its standard output: the agent's socket-LB
// programs see its connect() and sendmsg() calls.
func (e *Env) OutputInAgentCgroup(ctx context.Context, name string, args ...string) ([]byte, error) {
	e.mu.Lock()
	cleaned := e.cleaned
	e.mu.Unlock()
	if cleaned {
		return nil, errCleanedUp
	}
	dir := filepath.Join(e.cgroup, "client")
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := netns.Command(ctx, e.Node, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Pdeathsig: syscall.SIGKILL, Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd.Output()
}

// CgroupPrograms is `bpftool cgroup show` of the agent's cgroup: its
// socket-LB programs once its datapath is loaded.
func (e *Env) CgroupPrograms() (string, error) { return cgroupPrograms(e.cgroup) }

// CheckConfined checks that the agent's cgroup programs are on its own
// cgroup and that the host's cgroup2 root has the same programs as before
// Start. The cleanup checks it too while the agent still runs.
func (e *Env) CheckConfined() error {
	var errs []error
	if p, err := e.CgroupPrograms(); err != nil {
		errs = append(errs, err)
	} else if !strings.Contains(p, "cgroup_inet4_connect") {
		errs = append(errs, fmt.Errorf("no cgroup_inet4_connect program on the agent's cgroup %s:\n%s", e.cgroup, p))
	}
	return errors.Join(append(errs, e.checkRootPrograms())...)
}

// checkRootPrograms checks that the host's cgroup2 root has the programs it
// had before Start.
func (e *Env) checkRootPrograms() error {
	p, err := cgroupPrograms(e.cg2Root)
	if err != nil {
		return err
	}
	if p != e.host.cg2Progs {
		return fmt.Errorf("programs on the cgroup2 root %s changed while the agent runs:\n%s\nwere:\n%s", e.cg2Root, p, e.host.cg2Progs)
	}
	return nil
}

// Stop ends the agent: SIGTERM, then SIGKILL after 10 s, by its pid.
func (e *Env) Stop() {
	e.mu.Lock()
	p := e.agent
	e.mu.Unlock()
	if p == nil {
		return
	}
	p.Stop()
	e.mu.Lock()
	e.agentLogs = append(e.agentLogs, p.Output())
	e.agent = nil
	e.mu.Unlock()
}

// Restart stops the agent and starts it again with the same state
// directory, bpffs and cgroup, so that Cilium restores its maps, and waits
// until it is healthy.
func (e *Env) Restart() {
	e.tb.Helper()
	e.Stop()
	if err := e.startAgent(); err != nil {
		e.tb.Fatalf("agenttest: restart: %v", err)
	}
}

// cleanupOnSignal runs the cleanup when the test process is interrupted
// (go test's own handling would leave the namespaces and mounts behind),
// then exits.
func (e *Env) cleanupOnSignal() func() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			fmt.Fprintf(os.Stderr, "agenttest: %v: cleaning up\n", s)
			e.cleanup()
			// testing removes its temporary directories in cleanups that
			// exiting skips: the test's root is the parent of ours.
			if root := filepath.Dir(e.dir); strings.HasPrefix(filepath.Base(root), testDirPrefix(e.tb.Name())) {
				os.RemoveAll(root)
			}
			os.Exit(1)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}

// testDirPrefix is how testing names a test's temporary directory: its
// name up to the first character that is not a letter, digit or '_'.
func testDirPrefix(name string) string {
	if i := strings.IndexFunc(name, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}); i >= 0 {
		name = name[:i]
	}
	return name
}

// cleanup stops the agent, undoes every step of Start in reverse order and
// checks that the host is as it was found.
func (e *Env) cleanup() {
	e.mu.Lock()
	if e.cleaned {
		e.mu.Unlock()
		// Begun on a signal: the test must not end (and testing exit or
		// remove the directories under the mounts) before it is done.
		<-e.cleanDone
		return
	}
	e.cleaned = true
	stopSig := e.stopSig
	e.mu.Unlock()
	defer close(e.cleanDone)
	// The agent's log is long: shown only when it explains a failure.
	if e.tb.Failed() {
		if out := e.AgentOutput(); out != "" {
			e.tb.Logf("cilium-agent output (last lines):\n%s", tail(out, 80))
		}
	}
	var errs []error
	e.mu.Lock()
	running := e.agent != nil && !e.agent.Exited()
	e.mu.Unlock()
	if running {
		if err := e.checkRootPrograms(); err != nil {
			errs = append(errs, err)
		}
	}
	e.Stop()
	e.mu.Lock()
	steps := e.cleanups
	e.cleanups = nil
	e.mu.Unlock()
	for i := len(steps) - 1; i >= 0; i-- {
		if err := steps[i](); err != nil {
			errs = append(errs, err)
		}
	}
	if err := e.host.check(e); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		e.tb.Errorf("agenttest: cleanup: %v", err)
	}
	if stopSig != nil {
		stopSig()
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
