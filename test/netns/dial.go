// SPDX-License-Identifier: Apache-2.0

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Dial connects to addr from inside namespace ns. A socket belongs to the
// namespace it was created in, so the calling thread enters ns for the
// socket() and connect() only; the connection is then used from anywhere.
func Dial(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	target, err := os.Open(filepath.Join(runDir, ns))
	if err != nil {
		return nil, err
	}
	defer target.Close()
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer self.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter namespace %s: %w", ns, err)
	}
	var d net.Dialer
	conn, dialErr := d.DialContext(ctx, network, addr)
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, and ends with its goroutine: no other
		// goroutine runs in the wrong namespace.
		if conn != nil {
			conn.Close()
		}
		return nil, errors.Join(dialErr, fmt.Errorf("leave namespace %s: %w", ns, err))
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}
