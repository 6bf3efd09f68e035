// SPDX-License-Identifier: Apache-2.0

package main

import (
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A negative --max-connection-age is refused: gRPC would end every
// connection at once, and every agent would reconnect in a loop.
func TestMaxConnectionAgeNotNegative(t *testing.T) {
	f := serveFlags{resources: filepath.Join(t.TempDir(), "r.yaml"), insecure: true, logLevel: "info", maxConnectionAge: -time.Second}
	_, err := prepare(f, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--max-connection-age") {
		t.Fatalf("error %v, want one naming --max-connection-age", err)
	}
}
