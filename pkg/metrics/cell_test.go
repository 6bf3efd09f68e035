// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/cilium/hive"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/hivetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/l4xds/l4xds/pkg/version"
	"github.com/l4xds/l4xds/test/ports"
)

func newHive(addr string, invoke any) *hive.Hive {
	h := hive.New(Cell, cell.Invoke(invoke))
	hive.AddConfigOverride(h, func(c *Config) { c.PrometheusServeAddr = addr })
	return h
}

// What a cell registers is served on the address, with the Go and process
// collectors; stopped, the address is free again.
func TestServesTheRegistry(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", ports.Free(t, "tcp", 1)[0])

	h := newHive(addr, func(r prometheus.Registerer) {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "l4xds_test_total", Help: "A test counter"})
		c.Add(3)
		r.MustRegister(c)
	})
	log := hivetest.Logger(t)
	if err := h.Start(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"l4xds_test_total 3\n", "go_goroutines ", "process_cpu_seconds_total "} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := h.Stop(log, context.Background()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the address is still taken after stop: %v", err)
	}
	l.Close()
}

func TestAddressInUseFailsTheStartNamingIt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := newHive(l.Addr().String(), func(*prometheus.Registry) {})
	err = h.Start(hivetest.Logger(t), context.Background())
	if want := "--prometheus-serve-addr " + l.Addr().String(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("start = %v, want an error naming %q", err, want)
	}
}

// The registry says which build runs: l4xds_build_info is 1 with the
// version, commit and Go version that --version prints.
func TestBuildInfo(t *testing.T) {
	v := version.Get()
	want := fmt.Sprintf(`# HELP l4xds_build_info Always 1; the labels are the version, git commit and Go version of the agent
# TYPE l4xds_build_info gauge
l4xds_build_info{commit=%q,go_version=%q,version=%q} 1
`, v.Commit, v.GoVersion, v.Version)
	if err := testutil.GatherAndCompare(NewRegistry(), strings.NewReader(want), "l4xds_build_info"); err != nil {
		t.Error(err)
	}
}
