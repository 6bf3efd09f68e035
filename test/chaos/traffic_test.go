// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// privilegedDuration is the privileged variant's run inside `make test`:
// the schedules are the unprivileged variant's, the traffic is what it
// adds.
const privilegedDuration = 25 * time.Second

// The schedules with the BPF datapath on a namespace topology, and live
// traffic through the steady services, which every state serves alike:
// whatever the control planes do, the agent never touches them, and no
// flow through them fails: new TCP and UDP flows all along, and one TCP
// connection held from start to end. Root only.
func TestPrivilegedChaosWithTraffic(t *testing.T) {
	bin := netns.AgentBinaries(t)
	duration, seed := settings(t, privilegedDuration)
	sched := newSchedule(seed, duration >= longRun)
	n, protocol := sched.servers()
	report(t, "seed=%d duration=%s servers=%d protocol=%s datapath=bpf (CHAOS_SEED=%d replays this schedule)", seed, duration, n, protocol, seed)

	bpfRoot := netns.MountBPFFS(t)
	topo, err := netns.New(netns.UniquePrefix(), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := topo.Delete(); err != nil {
			t.Errorf("deleting the topology: %v", err)
		}
	})
	for i, b := range topo.Backends {
		args := []string{"serve", "--name", fmt.Sprintf("b%d", i)}
		for _, s := range steadyServices() {
			args = append(args, "--"+strings.ToLower(s.proto), fmt.Sprintf(":%d", s.port))
		}
		p, err := netns.StartProc("l4xds-traffic serve in "+b.NS, netns.Command(context.Background(), b.NS, filepath.Join(bin, "l4xds-traffic"), args...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		p.WaitOutput(t, "ready", 10*time.Second)
	}

	e := newEnv(t, bin, topo.LB, n)
	var tf *traffic
	tr := runSchedule(t, e, sched, seed, duration, func(tr *truth) {
		e.startAgent(t, protocol, "--datapath", "bpf", "--devices", netns.ClientDevice+","+netns.BridgeDevice, "--bpf-root", bpfRoot)
		tf = startTraffic(t, bin, topo.Client, tr.since)
	})
	failed, figures := tf.halt()
	report(t, "traffic: %s", figures)
	if len(failed) > 0 {
		t.Errorf("CHAOS flows failed through services every state serves alike (seed %d; CHAOS_SEED=%d replays the schedule):\n%s\n\nschedule (servers in priority order: %s):\n%s",
			seed, seed, strings.Join(failed, "\n"), strings.Join(e.addresses(), ", "), tr.schedule())
	}
}

func steadyServices() []service {
	var out []service
	for _, s := range universe {
		if s.steady {
			out = append(out, s)
		}
	}
	return out
}

// traffic is the client's flows through the steady services.
type traffic struct {
	begin time.Time
	hold  *netns.Proc
	stop  context.CancelFunc
	wg    sync.WaitGroup

	mu            sync.Mutex
	probes, flows int
	failed        []string
	halted        bool
	figures       string
}

// probeReport is what l4xds-traffic probe -o json prints.
type probeReport struct {
	Flows, Answered int
	Errors          map[string]int
	Examples        map[string]string
}

// startTraffic waits until every steady service answers from the client
// namespace, then keeps probing them with new flows and holds one TCP
// connection until halt.
// since says a moment as the schedule does.
func startTraffic(t *testing.T, bin, client string, since func(time.Time) string) *traffic {
	t.Helper()
	tf := &traffic{begin: time.Now()}
	trafficBin := filepath.Join(bin, "l4xds-traffic")
	probe := func(ctx context.Context, s service, flows int) (probeReport, error) {
		var r probeReport
		out, err := netns.Command(ctx, client, trafficBin, "probe", "--to", s.dial(), "--proto", strings.ToLower(s.proto),
			"--flows", fmt.Sprint(flows), "--concurrency", "2", "--timeout", "2s", "-o", "json").Output()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
			return r, fmt.Errorf("l4xds-traffic probe %s: %w", s.dial(), err)
		}
		if err := json.Unmarshal(out, &r); err != nil {
			return r, fmt.Errorf("l4xds-traffic probe %s: %w: %s", s.dial(), err, out)
		}
		return r, nil
	}
	for _, s := range steadyServices() {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			r, err := probe(context.Background(), s, 1)
			if err == nil && r.Answered == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never answered from the client (%v %+v)", s.dial(), err, r)
			}
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	tf.stop = stop
	hold, err := netns.StartProc("l4xds-traffic hold", netns.Command(context.Background(), client, trafficBin,
		"hold", "--to", steadyServices()[0].dial(), "--interval", "200ms"))
	if err != nil {
		t.Fatal(err)
	}
	tf.hold = hold
	t.Cleanup(func() { tf.halt() })
	for _, s := range steadyServices() {
		tf.wg.Go(func() {
			for ctx.Err() == nil {
				at := time.Now()
				r, err := probe(ctx, s, 10)
				if ctx.Err() != nil {
					return
				}
				tf.mu.Lock()
				tf.probes++
				tf.flows += r.Flows
				switch {
				case err != nil:
					tf.failed = append(tf.failed, fmt.Sprintf("%s: %v", since(at), err))
				case r.Answered < r.Flows:
					var kinds []string
					for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
						kinds = append(kinds, fmt.Sprintf("%d %s (%s)", r.Errors[k], k, r.Examples[k]))
					}
					tf.failed = append(tf.failed, fmt.Sprintf("%s: %s/%s: %d of %d new flows failed: %s",
						since(at), s.dial(), s.proto, r.Flows-r.Answered, r.Flows, strings.Join(kinds, ", ")))
				}
				tf.mu.Unlock()
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	return tf
}

// halt ends the traffic and returns the failures and the figures.
func (tf *traffic) halt() ([]string, string) {
	tf.stop()
	tf.wg.Wait()
	tf.mu.Lock()
	defer tf.mu.Unlock()
	if !tf.halted {
		tf.halted = true
		if tf.hold.Exited() {
			tf.failed = append(tf.failed, "the held connection failed:\n"+tail(tf.hold.Output(), 10))
		}
		tf.hold.Stop()
		echoes := strings.Count(tf.hold.Output(), "\nok ")
		tf.figures = fmt.Sprintf("%d new flows in %d probes over %s, %d failed; held connection: %d echoes",
			tf.flows, tf.probes, time.Since(tf.begin).Round(time.Second), len(tf.failed), echoes)
	}
	return slices.Clone(tf.failed), tf.figures
}
