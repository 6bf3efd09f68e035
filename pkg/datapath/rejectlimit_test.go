// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"strings"
	"testing"
	"time"
)

// The node's reject limit is shared between its CPUs: together they send
// the node's rate, and each saves up its share of the burst, at least one.
func TestRejectLimitShare(t *testing.T) {
	for _, c := range []struct {
		rate, burst         uint
		cpus                int
		interval, burstTime time.Duration
	}{
		{rate: 0, burst: 50, cpus: 4},
		{rate: 1000, burst: 50, cpus: 1, interval: time.Millisecond, burstTime: 50 * time.Millisecond},
		// 250 a second and 12.5 rejects each.
		{rate: 1000, burst: 50, cpus: 4, interval: 4 * time.Millisecond, burstTime: 50 * time.Millisecond},
		// A burst smaller than the CPUs: one each.
		{rate: 1000, burst: 2, cpus: 64, interval: 64 * time.Millisecond, burstTime: 64 * time.Millisecond},
		{rate: 1, burst: 1, cpus: 2, interval: 2 * time.Second, burstTime: 2 * time.Second},
		{rate: MaxRejectRate, burst: MaxRejectBurst, cpus: 1, interval: time.Microsecond, burstTime: time.Second},
	} {
		interval, burst := rejectLimit(c.rate, c.burst, c.cpus)
		if time.Duration(interval) != c.interval || time.Duration(burst) != c.burstTime {
			t.Errorf("rate %d, burst %d on %d CPUs: interval %s and burst %s per CPU, want %s and %s",
				c.rate, c.burst, c.cpus, time.Duration(interval), time.Duration(burst), c.interval, c.burstTime)
		}
	}
}

func TestCountCPUs(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-1": 2, "0-3,5,7-8": 7, "2-2": 1} {
		if got, err := countCPUs(list); err != nil || got != want {
			t.Errorf("countCPUs(%q) = %d, %v, want %d", list, got, err, want)
		}
	}
	for _, list := range []string{"", "a", "3-1", "0-", "-1"} {
		if _, err := countCPUs(list); err == nil || !strings.Contains(err.Error(), "CPU list") {
			t.Errorf("countCPUs(%q): error %v, want one naming the CPU list", list, err)
		}
	}
	n, err := onlineCPUs()
	if err != nil || n < 1 {
		t.Errorf("onlineCPUs() = %d, %v", n, err)
	}
}
