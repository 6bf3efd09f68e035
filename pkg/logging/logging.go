// SPDX-License-Identifier: Apache-2.0

// Package logging makes the slog loggers of the agent and the control
// plane: text for people (the default), or JSON lines for a log pipeline
// (--log-format=json).
package logging

import (
	"fmt"
	"io"
	"log/slog"
)

// Formats are the values of --log-format.
const (
	Text = "text"
	JSON = "json"
)

// FlagUsage is --log-format's help.
const FlagUsage = `log format: "text" (key=value) or "json" (one JSON object a line)`

// New returns a logger writing to w in format at level and above.
func New(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case Text, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case JSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want %q or %q", format, Text, JSON)
}
