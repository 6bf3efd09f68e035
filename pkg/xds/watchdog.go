// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// The run loop's own health. Health and status are written by the run
// loop, so a loop that hangs (a consumer that never returns, a send that
// never ends, a session that never ends) would keep saying what was true
// before it hung. The watchdog is the one writer that does not depend on
// the loop: it reports a loop busy with one thing for longer than
// stallAfter, and the loop clears the report when it moves on.

// defaultStallAfter is long enough for the largest update a consumer
// applies in one go (a million backends take seconds), short enough that
// an operator sees a hang before anything else does.
const defaultStallAfter = time.Minute

// loopWatch is what the run loop is busy with, and whether the watchdog
// reported it.
type loopWatch struct {
	mu      sync.Mutex
	what    string // empty while the loop waits for its next event
	since   time.Time
	stalled string // the reason reported, empty if none
}

// busy marks the start of a step of the run loop.
func (c *Client) busy(what string) {
	c.watch.mu.Lock()
	c.watch.what, c.watch.since = what, time.Now()
	c.watch.mu.Unlock()
}

// idle marks the end of a step. If the step had been reported stuck, the
// run loop's own status and health replace the report.
func (c *Client) idle() {
	c.watch.mu.Lock()
	c.watch.what = ""
	stalled := c.watch.stalled
	c.watch.stalled = ""
	c.watch.mu.Unlock()
	if stalled != "" {
		c.log.Info("xDS client is running again", "was", stalled)
		c.writeAllStatus()
		c.reportHealth()
	}
}

// watchdog checks the run loop every interval until ctx ends.
func (c *Client) watchdog(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.checkLoop(now)
		}
	}
}

// checkLoop reports a step that has run longer than stallAfter, once. It
// holds the lock while it writes so that idle's rewrite comes after it.
func (c *Client) checkLoop(now time.Time) {
	c.watch.mu.Lock()
	defer c.watch.mu.Unlock()
	w := &c.watch
	if w.what == "" || w.stalled != "" || now.Sub(w.since) < c.stallAfter {
		return
	}
	w.stalled = fmt.Sprintf("xDS client stuck for %s %s", now.Sub(w.since).Round(time.Second), w.what)
	c.log.Error("xDS client is stuck: nothing is received or applied until it moves on", "reason", w.stalled)
	c.degraded(w.stalled)
	// The rows as the loop last wrote them, with the reason: the loop's
	// own state is not read here, the loop may be writing it.
	txn := c.db.WriteTxn(c.status)
	for s := range c.status.All(txn) {
		row := *s
		row.Error = w.stalled
		c.status.Insert(txn, &row)
	}
	txn.Commit()
}
