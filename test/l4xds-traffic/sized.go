// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
)

// answerError is an answer that arrived but is not the one expected.
type answerError struct {
	kind string // kindShort or kindGarbled
	msg  string
}

func (e *answerError) Error() string { return e.msg }

func short(format string, args ...any) error {
	return &answerError{kindShort, fmt.Sprintf(format, args...)}
}

func garbled(format string, args ...any) error {
	return &answerError{kindGarbled, fmt.Sprintf(format, args...)}
}

// filler is n random lowercase letters: every flow's request differs, so an
// answer assembled from another flow's fragments or segments shows.
func filler(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(rand.N(26))
	}
	return b
}

// sizedUDP sends one datagram of size bytes and checks the padded answer
// (serve --udp-padded): as long as the datagram, "NAME\n" over its head,
// the rest of it unchanged.
func sizedUDP(c net.Conn, size int) (string, error) {
	req := filler(size)
	if _, err := c.Write(req); err != nil {
		return "", err
	}
	buf := make([]byte, 1<<16) // larger than any datagram: a long answer shows
	n, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	ans := buf[:n]
	i := bytes.IndexByte(ans, '\n')
	switch {
	case n < size:
		return "", short("answer of %d bytes to %d: %.32q", n, size, ans)
	case n > size:
		return "", garbled("answer of %d bytes to %d: %.32q", n, size, ans)
	case i < 1:
		return "", garbled("no NAME line in the answer: %.32q", ans)
	case !bytes.Equal(ans[i+1:], req[i+1:]):
		return "", garbled("%s answered %d bytes, %d differ from the request's", ans[:i], size, differing(ans[i+1:], req[i+1:]))
	}
	return string(ans[:i]), nil
}

// sizedTCP reads the server's name, sends a line of size bytes (newline
// included) and checks the echo, "NAME LINE".
func sizedTCP(c net.Conn, size int) (string, error) {
	r := bufio.NewReader(c)
	name, err := greeting(r)
	if err != nil {
		return "", err
	}
	line := append(filler(size-1), '\n')
	if _, err := c.Write(line); err != nil {
		return "", fmt.Errorf("sending %d bytes to %s: %w", size, name, err)
	}
	want := append([]byte(name+" "), line...)
	ans := make([]byte, len(want))
	n, err := io.ReadFull(r, ans)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return "", short("%s closed after %d of %d answer bytes", name, n, len(want))
	case err != nil:
		return "", fmt.Errorf("%s: %d of %d answer bytes: %w", name, n, len(want), err)
	case !bytes.Equal(ans, want):
		return "", garbled("%s answered %d bytes, %d differ from the echo of the request", name, n, differing(ans, want))
	}
	return name, nil
}

func differing(a, b []byte) int {
	d := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			d++
		}
	}
	return d + max(len(a), len(b)) - min(len(a), len(b))
}
