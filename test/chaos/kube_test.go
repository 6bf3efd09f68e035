// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/xds"
	"github.com/l4xds/l4xds/test/netns"
	"github.com/l4xds/l4xds/test/ports"
)

const (
	// kubeDuration is the Kubernetes schedules' run in `make test`;
	// CHAOS_DURATION sets another.
	kubeDuration = 30 * time.Second
	// kubeSettleBound bounds a settle (liveness, not timing): a Lease
	// held by a killed replica expires (15 s), informers list again after
	// their backoff, the agent's backoff, the leader writes status.
	kubeSettleBound = 2 * time.Minute
	kubeNamespace   = "default"
	kubeClass       = "l4xds.io/l4lb"
	// kubePool holds every VIP of the universe; each Service asks for its
	// own (l4xds.io/load-balancer-ips).
	kubePool = "chaos=10.1.2.0/23"
)

// kubeCluster is the name the control plane gives a Service's cluster.
func kubeCluster(name string) string { return "service/" + kubeNamespace + "/" + name }

// The control planes in Kubernetes mode: two replicas with leader election
// (both in the agent's list, in order) serve the LoadBalancer Services and
// EndpointSlices of a real kube-apiserver and etcd, which the schedule
// pauses (SIGSTOP of the API server, of etcd, or of both) and restarts
// (SIGKILL, start again on its port), restarting control planes while the
// API server is paused or down, and writing new states (the chaos
// universe's services as Services, their endpoints as EndpointSlices;
// DRAINING as serving and terminating). Checked on every sample: the
// agent's tables never lack what they held at the last settle and every
// state written since holds. At every settle: the tables hold the state
// in the API server, cp1 is in use, connected and healthy, every Service's
// status has its address (a leader writes, whoever it is after the
// faults), and both control planes are ready; a control plane restarted
// while the API server is paused or down says it is not ready.
func TestChaosKubernetesSchedules(t *testing.T) {
	requireKubeBinaries(t)
	bin := netns.Binaries(t)
	duration, seed := settings(t, kubeDuration)
	rnd := rand.New(rand.NewPCG(seed, 0x6b756265))
	protocol := []string{"sotw", "delta"}[rnd.IntN(2)]
	report(t, "kubernetes seed=%d duration=%s servers=2 protocol=%s datapath=none (CHAOS_SEED=%d replays this schedule)", seed, duration, protocol, seed)

	k := startKubeAPI(t, t.TempDir())
	e := newEnv(t, bin, "", 2)
	kc := &kubeChaos{t: t, e: e, k: k, rnd: rnd, seed: seed, begin: time.Now(), violated: make(chan struct{})}
	for _, p := range ports.Free(t, "tcp", 2) {
		kc.health = append(kc.health, fmt.Sprintf("127.0.0.1:%d", p))
	}
	kc.write(randomState(rnd, 0))
	for i := range e.servers {
		kc.must(kc.startCP(i))
	}
	e.startAgent(t, protocol, "--datapath", "none")

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { kc.observe(ctx) })
	defer func() {
		stop()
		wg.Wait()
	}()

	bursts := 0
	ok := kc.settle()
	for ok && time.Since(kc.begin) < duration {
		bursts++
		kc.burst()
		ok = kc.settle()
	}
	stop()
	wg.Wait()
	report(t, "kubernetes: %d bursts in %s; %s", bursts, time.Since(kc.begin).Round(time.Second), kc.figures())
	t.Logf("schedule as run:\n%s", strings.Join(kc.lines, "\n"))
	if kc.failure != "" {
		t.Errorf("CHAOS violation (seed %d; CHAOS_SEED=%d replays the schedule) %s\n\nschedule so far:\n%s\n\nagent output:\n%s",
			seed, seed, kc.failure, strings.Join(kc.lines, "\n"), tail(e.agent.Output(), 40))
		for i, s := range e.servers {
			t.Logf("cp%d output (tail):\n%s", i+1, tail(s.proc.Output(), 30))
		}
	}
}

// kubeChaos is a run of the Kubernetes schedules.
type kubeChaos struct {
	t      *testing.T
	e      *env
	k      *kubeAPI
	rnd    *rand.Rand
	seed   uint64
	begin  time.Time
	health []string // the control planes' --health-listen
	// applied is the state in the API server; nextID numbers states.
	applied *state
	nextID  int
	paused  []*netns.Proc

	mu    sync.Mutex
	lines []string // the schedule as run
	// required are the members the tables may not lack: what the last
	// settle's tables held and every state written since holds. Nil
	// before the first settle.
	required map[string]bool
	violated chan struct{}
	failure  string
	last     sample
	sampled  bool
	samples  int
	errors   int
	took     []time.Duration
}

func (kc *kubeChaos) note(format string, args ...any) {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	kc.lines = append(kc.lines, fmt.Sprintf("%8s  ", fmt.Sprintf("+%.1fs", time.Since(kc.begin).Seconds()))+fmt.Sprintf(format, args...))
}

// must fails the test on err, with the schedule so far.
func (kc *kubeChaos) must(err error) {
	kc.t.Helper()
	if err != nil {
		kc.mu.Lock()
		lines := strings.Join(kc.lines, "\n")
		kc.mu.Unlock()
		kc.t.Fatalf("%v\nschedule so far (seed %d):\n%s", err, kc.seed, lines)
	}
}

// violate records the first violation; kc.mu is held.
func (kc *kubeChaos) violate(format string, args ...any) {
	if kc.failure != "" {
		return
	}
	kc.failure = fmt.Sprintf("at +%.1fs: ", time.Since(kc.begin).Seconds()) + fmt.Sprintf(format, args...)
	close(kc.violated)
}

func (kc *kubeChaos) failed() bool {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	return kc.failure != ""
}

// observe reads the agent every sampleEvery and checks that its tables
// lack nothing required.
func (kc *kubeChaos) observe(ctx context.Context) {
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := kc.e.read(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		kc.mu.Lock()
		if err != nil {
			kc.errors++
			if kc.e.agent.Exited() {
				kc.violate("the agent exited (%v)", kc.e.agent.Cmd.ProcessState)
			}
		} else {
			kc.samples++
			kc.last, kc.sampled = s, true
			have := s.view.members()
			var missing []string
			for m := range kc.required {
				if !have[m] {
					missing = append(missing, m)
				}
			}
			if len(missing) > 0 {
				slices.Sort(missing)
				kc.violate("the agent's tables lack %s, which the tables held at the last settle and every state in the API server since holds; the tables:\n%s",
					strings.Join(missing, ", "), s.view)
			}
		}
		kc.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// burst is one burst of faults, by the seed: new states; the API server
// paused with control planes restarted meanwhile; the API server
// restarted, control planes maybe restarted while it is down; a control
// plane restarted with the API server up.
func (kc *kubeChaos) burst() {
	pause := func() { time.Sleep(time.Duration(200+kc.rnd.IntN(1800)) * time.Millisecond) }
	switch kc.rnd.IntN(4) {
	case 0:
		for range 1 + kc.rnd.IntN(2) {
			kc.write(randomState(kc.rnd, kc.nextID))
			pause()
		}
	case 1:
		procs, what := []*netns.Proc{kc.k.api}, "kube-apiserver"
		switch kc.rnd.IntN(3) {
		case 1:
			procs, what = []*netns.Proc{kc.k.etcd}, "etcd"
		case 2:
			procs, what = []*netns.Proc{kc.k.api, kc.k.etcd}, "kube-apiserver and etcd"
		}
		kc.note("pause %s (SIGSTOP)", what)
		for _, p := range procs {
			kc.must(p.Cmd.Process.Signal(syscall.SIGSTOP))
		}
		kc.paused = procs
		pause()
		// A paused etcd leaves the API server answering lists from its
		// watch cache: a control plane may sync, and be ready.
		apiPaused := slices.Contains(procs, kc.k.api)
		kc.restartSome(apiPaused)
		pause()
		kc.note("resume %s (SIGCONT)", what)
		for _, p := range kc.paused {
			kc.must(p.Cmd.Process.Signal(syscall.SIGCONT))
		}
		kc.paused = nil
	case 2:
		kc.note("kill kube-apiserver (SIGKILL)")
		kc.k.api.Kill()
		kc.restartSome(true)
		kc.note("start kube-apiserver")
		kc.must(kc.k.startAPIServer())
		kc.note("kube-apiserver ready")
		if kc.rnd.IntN(2) == 0 {
			kc.write(randomState(kc.rnd, kc.nextID))
		}
	case 3:
		kc.restartCP(kc.rnd.IntN(len(kc.e.servers)), true)
		if kc.rnd.IntN(2) == 0 {
			kc.write(randomState(kc.rnd, kc.nextID))
		}
	}
}

// restartSome restarts each control plane with some chance (at least one)
// while the API server is unavailable; then, if apiDown, each restarted
// one must say it is not ready: it cannot have read the cluster.
func (kc *kubeChaos) restartSome(apiDown bool) {
	var restarted []int
	for i := range kc.e.servers {
		if kc.rnd.IntN(100) < 60 {
			restarted = append(restarted, i)
		}
	}
	if len(restarted) == 0 {
		restarted = []int{kc.rnd.IntN(len(kc.e.servers))}
	}
	for _, i := range restarted {
		kc.restartCP(i, true)
	}
	if !apiDown {
		return
	}
	for _, i := range restarted {
		code, body := kc.readyz(i, 15*time.Second)
		if code != http.StatusServiceUnavailable {
			kc.mu.Lock()
			kc.violate("cp%d, restarted while the API server is unavailable, answers /readyz %d %q, want 503: it has not read the cluster", i+1, code, body)
			kc.mu.Unlock()
		}
	}
}

// restartCP restarts control plane i: SIGKILL, or SIGTERM when graceful
// may be (half the time).
func (kc *kubeChaos) restartCP(i int, graceful bool) {
	graceful = graceful && kc.rnd.IntN(2) == 0
	p := kc.e.servers[i].proc
	if graceful {
		kc.note("restart cp%d (SIGTERM)", i+1)
		p.Stop()
	} else {
		kc.note("restart cp%d (SIGKILL)", i+1)
		p.Kill()
	}
	kc.must(kc.startCP(i))
}

// startCP runs control plane i in Kubernetes mode on its address.
func (kc *kubeChaos) startCP(i int) error {
	e, s := kc.e, kc.e.servers[i]
	name := fmt.Sprintf("l4xds-control-plane cp%d (%s)", i+1, s.addr)
	cmd := e.command("l4xds-control-plane", "serve",
		"--kubeconfig", kc.k.kubeconfig, "--address-pool", kubePool,
		"--leader-elect", "--leader-elect-lease", kubeNamespace+"/l4xds-control-plane",
		"--listen", s.addr, "--health-listen", kc.health[i],
		"--cert", e.path("certs/server.crt"), "--key", e.path("certs/server.key"),
		"--client-ca", e.path("certs/ca.crt"))
	cmd.Env = append(os.Environ(), fmt.Sprintf("POD_NAME=cp%d", i+1))
	p, err := netns.StartProc(name, cmd)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	s.proc = p
	s.procs = append(s.procs, p)
	return nil
}

// readyz is control plane i's /readyz, once it answers (within timeout).
func (kc *kubeChaos) readyz(i int, timeout time.Duration) (int, string) {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+kc.health[i]+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			buf := make([]byte, 512)
			n, _ := resp.Body.Read(buf)
			resp.Body.Close()
			cancel()
			return resp.StatusCode, strings.TrimSpace(string(buf[:n]))
		}
		cancel()
		if time.Now().After(deadline) {
			return 0, err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// write puts state s into the API server: new Services' EndpointSlices
// before them, changed endpoints by one patch each, gone Services before
// their slices. What both states serve is never absent meanwhile.
func (kc *kubeChaos) write(s *state) {
	kc.nextID = s.id + 1
	want := s.viewAs(kubeCluster, false).members()
	kc.mu.Lock()
	if kc.required != nil {
		for m := range kc.required {
			if !want[m] {
				delete(kc.required, m)
			}
		}
	}
	kc.mu.Unlock()
	kc.note("write %s", s.describe())
	const svcs, slices_ = "/api/v1/namespaces/" + kubeNamespace + "/services", "/apis/discovery.k8s.io/v1/namespaces/" + kubeNamespace + "/endpointslices"
	for _, svc := range universe {
		eps, now := s.services[svc.name]
		var before []endpoint
		had := false
		if kc.applied != nil {
			before, had = kc.applied.services[svc.name]
		}
		switch {
		case now && !had:
			_, err := kc.k.must("POST", slices_, "", endpointSlice(svc, eps), http.StatusCreated)
			kc.must(err)
			_, err = kc.k.must("POST", svcs, "", kubeService(svc), http.StatusCreated)
			kc.must(err)
		case now && had && !slices.Equal(eps, before):
			patch := map[string]any{"endpoints": endpointSlice(svc, eps)["endpoints"]}
			_, err := kc.k.must("PATCH", slices_+"/"+svc.name, "application/merge-patch+json", patch, http.StatusOK)
			kc.must(err)
		case !now && had:
			_, err := kc.k.must("DELETE", svcs+"/"+svc.name, "", nil, http.StatusOK)
			kc.must(err)
			_, err = kc.k.must("DELETE", slices_+"/"+svc.name, "", nil, http.StatusOK)
			kc.must(err)
		}
	}
	kc.applied = s
}

// kubeService is svc as a LoadBalancer Service of the control plane's
// class that asks for svc's VIP.
func kubeService(svc service) map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": svc.name, "namespace": kubeNamespace,
			"annotations": map[string]string{"l4xds.io/load-balancer-ips": svc.vip}},
		"spec": map[string]any{
			"type": "LoadBalancer", "loadBalancerClass": kubeClass, "allocateLoadBalancerNodePorts": false,
			"ports": []map[string]any{{"port": svc.port, "protocol": svc.proto, "targetPort": svc.port}},
		},
	}
}

// endpointSlice is the endpoints of svc as its EndpointSlice: DRAINING
// ones serving and terminating, the others ready (weights have no place).
func endpointSlice(svc service, eps []endpoint) map[string]any {
	var list []map[string]any
	for _, e := range eps {
		cond := map[string]bool{"ready": true}
		if e.draining {
			cond = map[string]bool{"ready": false, "serving": true, "terminating": true}
		}
		list = append(list, map[string]any{"addresses": []string{netns.BackendIPv4(e.backend).String()}, "conditions": cond})
	}
	return map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": svc.name, "namespace": kubeNamespace,
			"labels": map[string]string{"kubernetes.io/service-name": svc.name, "endpointslice.kubernetes.io/managed-by": "chaos.l4xds.io"}},
		"addressType": "IPv4",
		"ports":       []map[string]any{{"name": "", "port": svc.port, "protocol": svc.proto}},
		"endpoints":   list,
	}
}

// settle waits until the agent holds the state in the API server from cp1,
// every Service's status has its address and both control planes are
// ready; false on a violation (recorded), or when that takes longer than
// kubeSettleBound.
func (kc *kubeChaos) settle() bool {
	begin := time.Now()
	want := kc.applied.viewAs(kubeCluster, false)
	var why string
	for {
		if kc.failed() {
			return false
		}
		why = kc.settled(want)
		if why == "" {
			break
		}
		if time.Since(begin) > kubeSettleBound {
			kc.mu.Lock()
			kc.violate("not settled within %s on %s: %s", kubeSettleBound, kc.applied, why)
			kc.mu.Unlock()
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(begin)
	kc.mu.Lock()
	kc.required = want.members()
	kc.took = append(kc.took, took)
	kc.mu.Unlock()
	kc.note("settled on %s in %s", kc.applied, took.Round(time.Millisecond))
	return true
}

// settled is what the settle still waits for, "" for nothing.
func (kc *kubeChaos) settled(want view) string {
	kc.mu.Lock()
	s, ok := kc.last, kc.sampled
	kc.mu.Unlock()
	if !ok {
		return "no sample of the agent yet"
	}
	if d := s.view.diff(want); len(d) > 0 {
		return "the agent's tables differ from the API server's state:\n  " + strings.Join(d, "\n  ")
	}
	i := slices.IndexFunc(s.servers, func(r *xds.ServerStatus) bool { return r.Priority == 1 })
	if addr, healthy := healthConnected(s); i < 0 || !s.servers[i].InUse || s.servers[i].State != xds.ConnConnected || !healthy || addr != kc.e.servers[0].addr {
		return fmt.Sprintf("want cp1 in use, connected and healthy; health: %s %s", s.xdsHealth.Level, s.xdsHealth.Message)
	}
	for i := range kc.e.servers {
		if code, body := kc.readyz(i, 0); code != http.StatusOK {
			return fmt.Sprintf("cp%d's /readyz: %d %s", i+1, code, body)
		}
	}
	out, err := kc.k.must("GET", "/api/v1/namespaces/"+kubeNamespace+"/services", "", nil, http.StatusOK)
	if err != nil {
		return err.Error()
	}
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Status   struct {
				LoadBalancer struct{ Ingress []struct{ IP string } }
			}
		}
	}
	if err := json.Unmarshal(out, &list); err != nil {
		return err.Error()
	}
	ips := map[string]string{}
	for _, it := range list.Items {
		if in := it.Status.LoadBalancer.Ingress; len(in) > 0 {
			ips[it.Metadata.Name] = in[0].IP
		}
	}
	for _, svc := range universe {
		if _, ok := kc.applied.services[svc.name]; ok && ips[svc.name] != svc.vip {
			return fmt.Sprintf("Service %s's status has address %q, want %s (no leader writing?)", svc.name, ips[svc.name], svc.vip)
		}
	}
	return ""
}

func (kc *kubeChaos) figures() string {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	took := slices.Clone(kc.took)
	slices.Sort(took)
	var median, longest time.Duration
	if len(took) > 0 {
		median, longest = took[len(took)/2], took[len(took)-1]
	}
	return fmt.Sprintf("settles: %d, median %s, longest %s; %d samples, %d failed reads",
		len(took), median.Round(time.Millisecond), longest.Round(time.Millisecond), kc.samples, kc.errors)
}
