// SPDX-License-Identifier: Apache-2.0

package memlimit

import (
	"testing"
	"testing/fstest"
)

func TestLimit(t *testing.T) {
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	for _, tc := range []struct {
		name   string
		self   string
		files  fstest.MapFS
		want   int64
		errMsg string
	}{
		{name: "v2 in a cgroup namespace", self: "0::/\n",
			files: fstest.MapFS{"memory.max": file("536870912\n")}, want: 512 << 20},
		{name: "v2 under its path", self: "0::/kubepods/pod1/c1\n",
			files: fstest.MapFS{"kubepods/pod1/c1/memory.max": file("268435456\n"), "memory.max": file("max\n")}, want: 256 << 20},
		{name: "v2 path not mounted: the root is the container's", self: "0::/kubepods/pod1/c1\n",
			files: fstest.MapFS{"memory.max": file("268435456\n")}, want: 256 << 20},
		{name: "v2 without a limit", self: "0::/\n",
			files: fstest.MapFS{"memory.max": file("max\n")}},
		{name: "v1", self: "12:pids:/docker/abc\n9:memory:/docker/abc\n1:name=systemd:/docker/abc\n",
			files: fstest.MapFS{"memory/memory.limit_in_bytes": file("1073741824\n")}, want: 1 << 30},
		{name: "v1 with cpu and memory joined", self: "4:cpu,memory:/x\n",
			files: fstest.MapFS{"memory/x/memory.limit_in_bytes": file("1073741824\n")}, want: 1 << 30},
		{name: "v1 without a limit", self: "9:memory:/\n",
			files: fstest.MapFS{"memory/memory.limit_in_bytes": file("9223372036854771712\n")}},
		{name: "no memory controller", self: "8:pids:/\n", files: fstest.MapFS{}},
		{name: "a path that climbs out stays under the root", self: "0::/../../etc\n",
			files: fstest.MapFS{"etc/memory.max": file("1048576\n")}, want: 1 << 20},
		{name: "garbage", self: "0::/\n",
			files: fstest.MapFS{"memory.max": file("lots\n")}, errMsg: `memory.max: "lots" is not a memory limit`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Limit(tc.files, []byte(tc.self))
			if tc.errMsg != "" {
				if err == nil || err.Error() != tc.errMsg {
					t.Fatalf("error %v, want %q", err, tc.errMsg)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Limit = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// GOMEMLIMIT is the operator's: set, even to off, it is left alone.
func TestFromCgroupLeavesGOMEMLIMIT(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "off")
	if cg, set, err := FromCgroup(); cg != 0 || set != 0 || err != nil {
		t.Fatalf("FromCgroup = %d, %d, %v with GOMEMLIMIT set", cg, set, err)
	}
}
