// SPDX-License-Identifier: Apache-2.0

// Package memlimit gives the Go runtime a memory limit from the process's
// cgroup (its container's), so that the garbage collector works harder
// before the container is killed rather than after. Without a limit the
// runtime lets the heap grow to twice what is live (GOGC=100) however close
// that is to the container's limit.
package memlimit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// Share is the part of the cgroup's limit given to the runtime: the rest is
// for what the runtime does not count but the cgroup does (the binary's
// pages, the kernel's socket buffers).
const Share = 0.9

// FromCgroup sets the runtime's memory limit to Share of the cgroup's memory
// limit, unless GOMEMLIMIT is set (then that is the operator's choice) or
// the cgroup has no limit. It returns the cgroup's limit and the one set,
// both 0 when it set none.
func FromCgroup() (cgroup, set int64, err error) {
	if _, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		return 0, 0, nil
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return 0, 0, err
	}
	cgroup, err = Limit(os.DirFS("/sys/fs/cgroup"), self)
	if err != nil || cgroup == 0 {
		return 0, 0, err
	}
	set = int64(float64(cgroup) * Share)
	debug.SetMemoryLimit(set)
	return cgroup, set, nil
}

// Limit is the memory limit in bytes of the cgroup that procSelfCgroup (the
// contents of /proc/self/cgroup) names, read from the cgroup file system
// root: cgroup v2's memory.max or v1's memory.limit_in_bytes. 0 is no limit.
//
// The cgroup is looked up under its path and, failing that, at the root: in
// a container the path is the host's while the container's own cgroup is
// mounted at the root (cgroup v1, or v2 without a cgroup namespace).
func Limit(root fs.FS, procSelfCgroup []byte) (int64, error) {
	var files []string
	sc := bufio.NewScanner(bytes.NewReader(procSelfCgroup))
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		id, rest, _ := strings.Cut(sc.Text(), ":")
		controllers, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		path = strings.TrimPrefix(filepath.Clean("/"+path), "/")
		switch {
		case id == "0" && controllers == "":
			files = append(files, filepath.Join(path, "memory.max"), "memory.max")
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			files = append(files, filepath.Join("memory", path, "memory.limit_in_bytes"), "memory/memory.limit_in_bytes")
		}
	}
	for _, f := range files {
		b, err := fs.ReadFile(root, filepath.ToSlash(f))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q is not a memory limit", f, v)
		}
		// cgroup v1 says none with the largest page-aligned int64.
		if n <= 0 || n > 1<<62 {
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}
