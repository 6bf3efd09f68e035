// SPDX-License-Identifier: Apache-2.0

package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchDebounce lets an editor or a ConfigMap update finish its writes and
// renames before the file is read. watchMaxDelay bounds the wait, so that a
// directory that never quiets down (other programs' files beside ours)
// cannot hold an edit back.
const (
	watchDebounce = 100 * time.Millisecond
	watchMaxDelay = time.Second
)

// WatchFile calls fn with the parsed contents of path, first right away,
// then every time they change, until ctx is done. It returns early only when
// the watch cannot be set up.
//
// It watches the file's directory rather than the file, so that an editor's
// rename-over-the-original, a file deleted and created again, and a
// Kubernetes ConfigMap's symlink swap are seen like a plain write. When path
// is a symlink into another directory, that directory is watched too.
// A file that cannot be read or parsed is reported to fn, once, with a nil
// Resources; a later good edit is reported as usual.
func WatchFile(ctx context.Context, path string, fn func(Resources, error), opts ...ParseOption) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	defer w.Close()
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching %s: %w", path, err)
	}
	// The directory as the kernel knows it, to not watch it twice.
	dir = realDir(dir)

	// Compare contents, not events: a directory sees many unrelated events,
	// and touching the file must not re-apply it.
	var (
		last      []byte // contents last reported
		lastErr   string // read error last reported
		targetDir string // directory of the symlink's target, when watched
	)
	read := func() {
		// Edits of a symlink's target happen in the target's directory.
		// Best effort: the directory of path alone still sees swaps.
		if target, err := filepath.EvalSymlinks(path); err == nil {
			want := realDir(filepath.Dir(target))
			if want == dir {
				want = ""
			}
			if want != targetDir {
				if targetDir != "" {
					_ = w.Remove(targetDir)
				}
				targetDir = ""
				if want != "" && w.Add(want) == nil {
					targetDir = want
				}
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			last = nil
			if err.Error() != lastErr {
				lastErr = err.Error()
				fn(nil, err)
			}
			return
		}
		lastErr = ""
		if last != nil && bytes.Equal(data, last) {
			return
		}
		last = data
		res, err := ParseResources(data, opts...)
		if err != nil {
			err = fmt.Errorf("%s: %w", path, err)
		}
		fn(res, err)
	}
	read()

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var deadline time.Time // of the pending read; zero when none is
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(watchMaxDelay)
			}
			timer.Reset(min(watchDebounce, deadline.Sub(now)))
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			fn(nil, fmt.Errorf("watching %s: %w", path, err))
		case <-timer.C:
			deadline = time.Time{}
			read()
		}
	}
}

// ServeFile serves the resources of path and keeps serving its latest good
// contents until ctx is done. It returns once the file has been applied, or
// with the error if the file is invalid at the start. A bad edit later is
// logged as one line naming the file, document and field, and the last good
// resources stay served.
func (s *Server) ServeFile(ctx context.Context, path string, opts ...ParseOption) error {
	return ApplyFile(ctx, path, s.log, s.Set, opts...)
}

// ApplyFile is ServeFile for any consumer of resources: set is called with
// the file's resources, then with every good edit, until ctx is done.
func ApplyFile(ctx context.Context, path string, log *slog.Logger, set func(Resources) error, opts ...ParseOption) error {
	ctx, cancel := context.WithCancel(ctx)
	started := make(chan error, 2)
	first := true
	go func() {
		err := WatchFile(ctx, path, func(res Resources, err error) {
			if first {
				first = false
				if err == nil {
					err = set(res)
				}
				if err != nil {
					cancel()
				}
				started <- err
				return
			}
			if err != nil {
				log.Error("Resource file not applied, still serving the last good one", "error", err)
				return
			}
			log.Info("Resource file changed", "file", path)
			if err := set(res); err != nil {
				log.Error("Applying resource file", "file", path, "error", err)
			}
		}, opts...)
		started <- err // only read if the watch failed before the first call
		cancel()
	}()
	return <-started
}

// realDir is dir with symlinks resolved, absolute; dir itself if that fails.
func realDir(dir string) string {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return dir
}
