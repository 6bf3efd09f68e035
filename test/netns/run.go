// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// RunSettings are a randomized run's duration and seed from the
// environment: <PREFIX>_DURATION (at least the given least, else def) and
// <PREFIX>_SEED (else the time), which replays a run.
func RunSettings(tb testing.TB, prefix string, def, least time.Duration) (time.Duration, uint64) {
	tb.Helper()
	duration := def
	if s := os.Getenv(prefix + "_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < least {
			tb.Fatalf("%s_DURATION=%q: want a duration of %s or more (%v)", prefix, s, least, err)
		}
		duration = d
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(prefix + "_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			tb.Fatalf("%s_SEED=%q: want an unsigned integer: %v", prefix, s, err)
		}
		seed = v
	}
	return duration, seed
}
