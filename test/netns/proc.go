// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a process a test runs (in a namespace, with Command) until it
// stops it: its output is readable while it runs.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	out  syncBuffer
	done chan struct{}
}

// StartProc starts cmd with its output captured.
func StartProc(name string, cmd *exec.Cmd) (*Proc, error) {
	p := &Proc{Name: name, Cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Output is what the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Exited tells whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process with SIGTERM, or SIGKILL after 10 s, and waits.
func (p *Proc) Stop() {
	if p.Exited() {
		return
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Kill ends the process with SIGKILL and waits.
func (p *Proc) Kill() {
	p.Cmd.Process.Kill()
	<-p.done
}

// WaitOutput waits until the process has printed want.
func (p *Proc) WaitOutput(tb testing.TB, want string, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.Output(), want) {
		if p.Exited() {
			tb.Fatalf("%s exited (%v) before printing %q:\n%s", p.Name, p.Cmd.ProcessState, want, p.Output())
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s did not print %q within %s:\n%s", p.Name, want, timeout, p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer is a process's output, readable while it runs.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(b)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
