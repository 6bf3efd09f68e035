// SPDX-License-Identifier: Apache-2.0

package tlsmetrics

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// certPEM is a self-signed certificate valid until notAfter, in PEM.
func certPEM(t *testing.T, cn string, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notAfter.Add(-365 * 24 * time.Hour),
		NotAfter:     notAfter,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func write(t *testing.T, path string, data ...[]byte) {
	t.Helper()
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	if err := os.WriteFile(path, all, 0o600); err != nil {
		t.Fatal(err)
	}
}

func expect(t *testing.T, c prometheus.Collector, series map[string]time.Time) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# HELP l4xds_tls_certificate_expiry_timestamp_seconds " + help + "\n")
	b.WriteString("# TYPE l4xds_tls_certificate_expiry_timestamp_seconds gauge\n")
	for labels, at := range series {
		fmt.Fprintf(&b, "l4xds_tls_certificate_expiry_timestamp_seconds{%s} %d\n", labels, at.Unix())
	}
	if err := testutil.CollectAndCompare(c, strings.NewReader(b.String())); err != nil {
		t.Error(err)
	}
}

// A chain expires with its first certificate, a CA bundle with its last;
// a rotated file is what the next scrape reports; a file that cannot be
// read keeps its last good expiry, and one never read has no series.
func TestCollector(t *testing.T) {
	dir := t.TempDir()
	day := 24 * time.Hour
	now := time.Now().Truncate(time.Second)
	leaf, inter := now.Add(10*day), now.Add(100*day)
	oldCA, newCA := now.Add(30*day), now.Add(3650*day)
	cert, ca, missing := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "ca.crt"), filepath.Join(dir, "none.crt")
	write(t, cert, certPEM(t, "leaf", leaf), certPEM(t, "intermediate", inter))
	write(t, ca, certPEM(t, "old CA", oldCA), certPEM(t, "new CA", newCA))

	c := New(
		File{Role: "xds-client", Path: cert},
		File{Role: "xds-ca", Path: ca, Bundle: true},
		File{Role: "server", Path: missing},
	)
	expect(t, c, map[string]time.Time{
		`file="` + ca + `",role="xds-ca"`:       newCA,
		`file="` + cert + `",role="xds-client"`: leaf,
	})

	// Renewed: the next scrape has it.
	renewed := now.Add(90 * day)
	write(t, cert, certPEM(t, "leaf", renewed))
	expect(t, c, map[string]time.Time{
		`file="` + ca + `",role="xds-ca"`:       newCA,
		`file="` + cert + `",role="xds-client"`: renewed,
	})

	// Half written, then gone: the last good value stays.
	write(t, cert, []byte("-----BEGIN CERTIFICATE-----\nMIIB"))
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	expect(t, c, map[string]time.Time{
		`file="` + ca + `",role="xds-ca"`:       newCA,
		`file="` + cert + `",role="xds-client"`: renewed,
	})
}

func TestExpiry(t *testing.T) {
	now := time.Now().Truncate(time.Second)
	a, b := certPEM(t, "a", now.Add(time.Hour)), certPEM(t, "b", now.Add(2*time.Hour))
	for _, tc := range []struct {
		name   string
		data   []byte
		bundle bool
		want   time.Time
		err    string
	}{
		{"chain", append(append([]byte{}, b...), a...), false, now.Add(time.Hour), ""},
		{"bundle", append(append([]byte{}, a...), b...), true, now.Add(2 * time.Hour), ""},
		{"a key is skipped", append([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), a...), false, now.Add(time.Hour), ""},
		{"empty", nil, false, time.Time{}, "no PEM certificate"},
		{"garbage", []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), true, time.Time{}, "certificate 1"},
	} {
		got, err := Expiry(tc.data, tc.bundle)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
