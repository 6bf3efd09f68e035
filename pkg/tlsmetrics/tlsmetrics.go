// SPDX-License-Identifier: Apache-2.0

// Package tlsmetrics exports when the TLS certificates a process uses
// expire, as l4xds_tls_certificate_expiry_timestamp_seconds{role,file}.
//
// The files are read at every scrape: the agent and the control plane read
// them again at handshakes, so what is on disk is what the next connection
// presents or verifies with, and a renewed certificate shows at the next
// scrape without waiting for one.
package tlsmetrics

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

const (
	name = "l4xds_tls_certificate_expiry_timestamp_seconds"
	help = "When the certificate file expires (Unix time): the first expiry of a chain, the last of a CA bundle; the last good value while the file cannot be read"
)

// File is one certificate file to watch.
type File struct {
	// Role says what the file is for: xds-client, xds-ca (the agent),
	// server, client-ca (the control plane).
	Role string
	Path string
	// Bundle: a bundle of CAs, which verifies until its last one expires
	// (during a rotation it holds the old CA and the new). Otherwise a
	// chain, which is unusable once any of its certificates has expired.
	Bundle bool
}

// Collector is a prometheus.Collector of the files' expiries.
type Collector struct {
	files []File
	desc  *prometheus.Desc

	mu   sync.Mutex
	last map[File]time.Time // the last good expiry of each file
}

// New returns a collector of the files' expiries.
func New(files ...File) *Collector {
	return &Collector{
		files: files,
		desc:  prometheus.NewDesc(name, help, []string{"role", "file"}, nil),
		last:  map[File]time.Time{},
	}
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads the files. One that cannot be read or parsed (a rotation
// caught half-written, a Secret not mounted yet) keeps its last good value,
// as the process keeps its previous certificates; one never read has no
// series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.files {
		if at, err := expiryOf(f); err == nil {
			c.last[f] = at
		}
		if at, ok := c.last[f]; ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(at.Unix()), f.Role, f.Path)
		}
	}
}

func expiryOf(f File) (time.Time, error) {
	data, err := os.ReadFile(f.Path)
	if err != nil {
		return time.Time{}, err
	}
	at, err := Expiry(data, f.Bundle)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", f.Path, err)
	}
	return at, nil
}

// Expiry returns when the PEM certificates in data stop being usable: the
// earliest NotAfter of a chain, the latest of a bundle. Blocks other than
// CERTIFICATE (a key in the same file) are skipped.
func Expiry(data []byte, bundle bool) (time.Time, error) {
	var at time.Time
	n := 0
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		n++
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return time.Time{}, fmt.Errorf("certificate %d: %w", n, err)
		}
		if n == 1 || (bundle && cert.NotAfter.After(at)) || (!bundle && cert.NotAfter.Before(at)) {
			at = cert.NotAfter
		}
	}
	if n == 0 {
		return time.Time{}, errors.New("no PEM certificate")
	}
	return at, nil
}
