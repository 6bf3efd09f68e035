// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchDebounce lets an editor or a ConfigMap update finish its writes and
// renames before the file is read.
const watchDebounce = 100 * time.Millisecond

// WatchFile calls fn with the parsed contents of path, first right away,
// then every time they change, until ctx is done. It returns early only when
// the watch cannot be set up.
//
// It watches the file's directory rather than the file, so that an editor's
// rename-over-the-original and a Kubernetes ConfigMap's symlink swap are seen
// like a plain write. A file that cannot be read or parsed is reported to fn
// with a nil Resources; a later good edit is reported as usual.
func WatchFile(ctx context.Context, path string, fn func(Resources, error), opts ...ParseOption) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(path)); err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}

	// Compare contents, not events: a directory sees many unrelated events,
	// and touching the file must not re-apply it.
	var last []byte
	read := func(initial bool) {
		data, err := os.ReadFile(path)
		if err != nil {
			last = nil
			fn(nil, err)
			return
		}
		if !initial && last != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		res, err := ParseResources(data, opts...)
		if err != nil {
			err = fmt.Errorf("%s: %w", path, err)
		}
		fn(res, err)
	}
	read(true)

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			timer.Reset(watchDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			fn(nil, fmt.Errorf("watching %s: %w", path, err))
		case <-timer.C:
			read(false)
		}
	}
}

// ServeFile serves the resources of path and keeps serving its latest good
// contents until ctx is done. It returns once the file has been applied, or
// with the error if the file is invalid at the start. A bad edit later is
// logged as one line naming the file, document and field, and the last good
// resources stay served.
func (s *Server) ServeFile(ctx context.Context, path string, opts ...ParseOption) error {
	ctx, cancel := context.WithCancel(ctx)
	started := make(chan error, 2)
	first := true
	go func() {
		err := WatchFile(ctx, path, func(res Resources, err error) {
			if first {
				first = false
				if err == nil {
					err = s.Set(res)
				}
				if err != nil {
					cancel()
				}
				started <- err
				return
			}
			if err != nil {
				s.log.Error("Resource file not applied, still serving the last good one", "error", err)
				return
			}
			s.log.Info("Resource file changed", "file", path)
			if err := s.Set(res); err != nil {
				s.log.Error("Applying resource file", "file", path, "error", err)
			}
		}, opts...)
		started <- err // only read if the watch failed before the first call
		cancel()
	}()
	return <-started
}
