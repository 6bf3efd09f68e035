// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// newFlowPause is the pause of a worker between two new flows.
const newFlowPause = 10 * time.Millisecond

// target is a frontend a client may start a flow to.
type target struct {
	frontend frontend
	service  string
}

// clients make the soak's traffic from the client namespace: workers
// opening new flows one after the other, and long-lived TCP connections
// that echo until their lifetime ends, then make way for new ones.
type clients struct {
	ns      string
	timeout time.Duration
	// targets lists what a new flow may go to now.
	targets func() []target

	mu       sync.Mutex
	flows    map[string]int // ended flows by "new TCP", "long TCP", "new UDP"
	answered int
	failed   []flow

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// start runs newFlows workers of new flows and long connections, each with
// a random source seeded from seed.
func (c *clients) start(seed uint64, newFlows, long int) {
	c.flows = map[string]int{}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	for i := range newFlows + long {
		rnd := rand.New(rand.NewPCG(seed, uint64(i)))
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for ctx.Err() == nil {
				var f flow
				if i < newFlows {
					f = c.newFlow(rnd)
				} else {
					f = c.longFlow(ctx, rnd)
				}
				if f.service == "" {
					// Nothing to go to: wait for the churn.
					select {
					case <-ctx.Done():
					case <-time.After(100 * time.Millisecond):
					}
					continue
				}
				c.ended(f)
				if !f.long {
					// A pace two shared cores keep up with: some
					// hundreds of new flows a second.
					time.Sleep(newFlowPause)
				}
			}
		}()
	}
}

// halt stops the clients and waits for their last flows: the long ones
// end cleanly.
func (c *clients) halt() {
	c.stop()
	c.wg.Wait()
}

func (c *clients) ended(f flow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kind := "new "
	if f.long {
		kind = "long "
	}
	c.flows[kind+f.frontend.proto]++
	if f.err != nil {
		c.failed = append(c.failed, f)
	} else {
		c.answered++
	}
}

func (c *clients) pick(rnd *rand.Rand, proto string) (target, bool) {
	var ts []target
	for _, t := range c.targets() {
		if proto == "" || t.frontend.proto == proto {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		return target{}, false
	}
	return ts[rnd.IntN(len(ts))], true
}

// newFlow opens one flow: for TCP the greeting (the backend's name) and
// one echo, then a clean close; for UDP one datagram and its answer.
func (c *clients) newFlow(rnd *rand.Rand) flow {
	t, ok := c.pick(rnd, "")
	if !ok {
		return flow{}
	}
	f := flow{frontend: t.frontend, service: t.service, start: time.Now(), backend: -1}
	f.backend, f.err = c.exchange(t.frontend)
	f.end = time.Now()
	return f
}

func (c *clients) exchange(fe frontend) (backend int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	conn, err := netns.Dial(ctx, c.ns, strings.ToLower(fe.proto), fe.dial())
	if err != nil {
		return -1, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(c.timeout))
	if fe.proto == "UDP" {
		if _, err := conn.Write([]byte("soak")); err != nil {
			return -1, err
		}
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		if err != nil {
			return -1, err
		}
		return backendOf(string(buf[:n]))
	}
	r := bufio.NewReader(conn)
	backend, err = greeting(r)
	if err != nil {
		return backend, err
	}
	return backend, echo(conn, r, backend, 1)
}

// longFlow holds a TCP connection for a random 3 to 20 s, echoing every
// 200 ms; it ends early, cleanly, when the clients stop.
func (c *clients) longFlow(ctx context.Context, rnd *rand.Rand) flow {
	t, ok := c.pick(rnd, "TCP")
	if !ok {
		return flow{}
	}
	f := flow{frontend: t.frontend, service: t.service, long: true, start: time.Now(), backend: -1}
	defer func() { f.end = time.Now() }()
	lifetime := time.NewTimer(3*time.Second + time.Duration(rnd.Int64N(int64(17*time.Second))))
	defer lifetime.Stop()
	dctx, cancel := context.WithTimeout(ctx, c.timeout)
	conn, err := netns.Dial(dctx, c.ns, "tcp", t.frontend.dial())
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return flow{} // stopped while connecting: not a flow
		}
		f.err, f.end = err, time.Now()
		return f
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	conn.SetDeadline(time.Now().Add(c.timeout))
	if f.backend, f.err = greeting(r); f.err != nil {
		f.end = time.Now()
		return f
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for seq := 1; ; seq++ {
		select {
		case <-ctx.Done():
			f.end = time.Now()
			return f
		case <-lifetime.C:
			f.end = time.Now()
			return f
		case <-tick.C:
		}
		conn.SetDeadline(time.Now().Add(c.timeout))
		if err := echo(conn, r, f.backend, seq); err != nil {
			f.err, f.end = fmt.Errorf("echo %d: %w", seq, err), time.Now()
			return f
		}
	}
}

// greeting reads the backend's name, the first line of a connection.
func greeting(r *bufio.Reader) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return -1, fmt.Errorf("greeting: %w", err)
	}
	return backendOf(strings.TrimSpace(line))
}

// echo sends a line and reads its echo, which names the backend.
func echo(conn net.Conn, r *bufio.Reader, backend, seq int) error {
	if _, err := fmt.Fprintf(conn, "%d\n", seq); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("b%d %d\n", backend, seq); line != want {
		return fmt.Errorf("answer %q, want %q", line, want)
	}
	return nil
}

// backendOf parses a backend's name, b<i>.
func backendOf(name string) (int, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "b"))
	if err != nil || !strings.HasPrefix(name, "b") || i < 0 || i >= backends {
		return -1, errors.New("answer from an unknown backend: " + strconv.Quote(name))
	}
	return i, nil
}

// counts returns the ended flows by kind, the answered ones and the
// failed ones.
func (c *clients) counts() (flows map[string]int, answered int, failed []flow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	flows = map[string]int{}
	for k, v := range c.flows {
		flows[k] = v
	}
	return flows, c.answered, append([]flow(nil), c.failed...)
}
