// SPDX-License-Identifier: Apache-2.0

package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, JSON, slog.LevelInfo)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	log.Info("Serving xDS", "address", "127.0.0.1:9000")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %v\n%s", err, buf.String())
	}
	if line["msg"] != "Serving xDS" || line["address"] != "127.0.0.1:9000" || line["level"] != "INFO" {
		t.Errorf("JSON line %v", line)
	}

	buf.Reset()
	if log, err = New(&buf, Text, slog.LevelDebug); err != nil {
		t.Fatal(err)
	}
	log.Debug("shown", "k", "v")
	if got := buf.String(); !strings.Contains(got, "level=DEBUG msg=shown k=v") {
		t.Errorf("text line %q", got)
	}

	if _, err := New(&buf, "yaml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), `--log-format "yaml"`) {
		t.Errorf("an unknown format: %v", err)
	}
}
