// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4xds/l4xds/pkg/devcerts"
	"github.com/l4xds/l4xds/pkg/tlsmetrics"
)

// With TLS, /metrics says when the server certificate (role server) and
// the client CA (client-ca) expire.
func TestServeCertificateExpiryMetrics(t *testing.T) {
	_, healthAddr := testListeners(t)
	dir := t.TempDir()
	if err := devcerts.Write(dir, devcerts.Options{Validity: 72 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "resources.yaml")
	data, err := os.ReadFile("../../examples/cfp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(path, data, 0o644)
	cert, ca := filepath.Join(dir, devcerts.ServerCert), filepath.Join(dir, devcerts.CACert)
	var want []string
	for _, f := range []struct{ role, path string }{{"client-ca", ca}, {"server", cert}} {
		pem, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		at, err := tlsmetrics.Expiry(pem, false)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("\nl4xds_tls_certificate_expiry_timestamp_seconds{file=%q,role=%q} %g\n", f.path, f.role, float64(at.Unix())))
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs syncBuffer
	go func() {
		cmd := newCommand(&logs, &logs)
		cmd.SetArgs([]string{"serve", "--resources", path, "--listen", "xds", "--health-listen", "health",
			"--cert", cert, "--key", filepath.Join(dir, devcerts.ServerKey), "--client-ca", ca})
		done <- cmd.ExecuteContext(ctx)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(testTimeout)
	for {
		var body []byte
		resp, err := hc.Get("http://" + healthAddr + "/metrics")
		if err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			missing := 0
			for _, w := range want {
				if !strings.Contains(string(body), w) {
					missing++
				}
			}
			if missing == 0 {
				return
			}
			err = fmt.Errorf("%d of %q missing", missing, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics: %v\n%s\n%s", err, body, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
