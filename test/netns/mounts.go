// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"os"
	"slices"
	"strconv"
	"strings"
)

// Mounts lists, in mount order, the mount points this process's mount
// namespace has of file systems of type fstype ("" for any) at or under
// dir ("" for anywhere).
func Mounts(fstype, dir string) ([]string, error) {
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var points []string
	for line := range strings.Lines(string(info)) {
		// ID parent major:minor root mount-point options [optional...] - fstype source super-options
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if sep < 5 || sep+1 >= len(fields) || (fstype != "" && fields[sep+1] != fstype) {
			continue
		}
		point := unescapeMountPoint(fields[4])
		if dir != "" && point != dir && !strings.HasPrefix(point, dir+"/") {
			continue
		}
		points = append(points, point)
	}
	return points, nil
}

// unescapeMountPoint undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPoint(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
