// SPDX-License-Identifier: Apache-2.0

package soak

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/l4xds/l4xds/test/netns"
)

// The agent's own resources, from its Prometheus endpoint.
const (
	heapMetric = "go_memstats_heap_alloc_bytes"
	// heapGoalMetric is the heap size at which the next GC starts, which
	// the last GC set to twice the live heap it found (GOGC=100; 4 MiB at
	// least): the live heap, read from any sample. The heap in use itself
	// swings between the live heap and that goal.
	heapGoalMetric   = "go_memstats_next_gc_bytes"
	goroutinesMetric = "go_goroutines"
	fdsMetric        = "process_open_fds"
)

var resourceMetrics = []string{heapMetric, heapGoalMetric, goroutinesMetric, fdsMetric}

// sample is one scrape of the agent's resources.
type sample struct {
	at     time.Time
	values map[string]float64
}

// scraper reads the agent's metrics inside its namespace.
type scraper struct {
	client *http.Client
	url    string
}

func newScraper(ns, addr string) *scraper {
	return &scraper{url: "http://" + addr + "/metrics", client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // the agent restarts: no connection to reuse
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return netns.Dial(ctx, ns, network, addr)
		},
	}}}
}

func (s *scraper) scrape() (sample, error) {
	resp, err := s.client.Get(s.url)
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return sample{}, fmt.Errorf("GET %s: %s", s.url, resp.Status)
	}
	out := sample{at: time.Now(), values: map[string]float64{}}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		name, value, ok := strings.Cut(lines.Text(), " ")
		if !ok || !slices.Contains(resourceMetrics, name) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return sample{}, fmt.Errorf("%s: %q: %w", name, value, err)
		}
		out.values[name] = v
	}
	if err := lines.Err(); err != nil {
		return sample{}, err
	}
	for _, m := range resourceMetrics {
		if _, ok := out.values[m]; !ok {
			return sample{}, fmt.Errorf("%s lacks %s", s.url, m)
		}
	}
	return out, nil
}

// quarter summarises one metric over a quarter of the run.
type quarter struct {
	n                int
	min, median, max float64
}

func summarise(samples []sample, metric string, from, to time.Time) quarter {
	var vs []float64
	for _, s := range samples {
		if !s.at.Before(from) && s.at.Before(to) {
			vs = append(vs, s.values[metric])
		}
	}
	if len(vs) == 0 {
		return quarter{}
	}
	slices.Sort(vs)
	return quarter{n: len(vs), min: vs[0], median: vs[len(vs)/2], max: vs[len(vs)-1]}
}

// flatness is a bound on how a metric may grow from the first quarter of
// the run to the last.
type flatness struct {
	metric string
	// of picks the statistic compared: the median, which a moment's
	// change (a control-plane outage, a reconnect) does not move.
	of    func(quarter) float64
	label string
	// The last quarter may exceed the first by factor and slack. The
	// resources served are bounded (8 services, 4 backends each at most),
	// so a steady agent's live heap, goroutines and fds are too; the heap
	// has room for caches that fill to a fixed size after the start
	// (StateDB's indexes and freed nodes, the xDS client's resources,
	// gRPC's buffers), the goroutines for the xDS stream and the
	// connections being reopened at a sample, the fds for sockets of
	// clients of the API and metrics being served.
	factor, slack float64
}

var flatnessBounds = []flatness{
	{heapGoalMetric, func(q quarter) float64 { return q.median }, "median", 1.5, 4 << 20},
	{goroutinesMetric, func(q quarter) float64 { return q.median }, "median", 1, 10},
	{fdsMetric, func(q quarter) float64 { return q.median }, "median", 1, 5},
}

func (f flatness) check(first, last quarter) error {
	a, b := f.of(first), f.of(last)
	if limit := a*f.factor + f.slack; b > limit {
		return fmt.Errorf("%s grew from %s %.0f in the first quarter to %.0f in the last, over the bound %.0f (x%.2f + %.0f)",
			f.metric, f.label, a, b, limit, f.factor, f.slack)
	}
	return nil
}
