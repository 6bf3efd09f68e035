// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"context"
	"strconv"

	"google.golang.org/protobuf/types/known/anypb"
)

// SetSliceBytes sets, until the test ends, the size of the first slice of a
// response to an InGrowingSlices handler and the most a slice grows to,
// which is also every slice of an InSlices handler.
func SetSliceBytes(t interface{ Cleanup(func()) }, first, most int) {
	old := [3]int{sliceBytes, firstSliceBytes, grownSliceBytes}
	sliceBytes, firstSliceBytes, grownSliceBytes = most, first, most
	t.Cleanup(func() { sliceBytes, firstSliceBytes, grownSliceBytes = old[0], old[1], old[2] })
}

// Driver drives a Client by hand for the tests of package xds_test (the
// fuzzers): one stream whose requests are recorded, and responses handed to
// the client as its run loop hands them, without gRPC or a clock.
type Driver struct {
	c      *Client
	st     *recordingStream
	nonces int
}

// NewDriver connects c, whose watches are set, to a stream of its own.
func NewDriver(c *Client) (*Driver, error) {
	d := &Driver{c: c, st: &recordingStream{}}
	if c.health == nil {
		c.health = nopHealth{} // as Run sets it
	}
	c.applyWatches()
	c.startStream()
	c.setConn(ConnConnected, nil)
	err := c.sendAll(d.st)
	c.writeBehind()
	return d, err
}

// ApplyWatches requests, as the run loop does, the names the handlers set,
// and writes the rows then due.
func (d *Driver) ApplyWatches() error {
	err := d.c.requestWatches(d.st)
	d.c.writeBehind()
	return err
}

// Respond hands the client one response: version is the SotW version_info,
// or the Delta system_version_info and each resource's version; names are
// the Delta resources' names (ignored in SotW); removed is Delta's
// removed_resources. It returns the NACK's error_detail, "" for an ACK.
func (d *Driver) Respond(typeURL, version string, names []string, resources []*anypb.Any, removed []string) (string, error) {
	d.nonces++
	resp := &response{typeURL: typeURL, version: version, nonce: "nonce-" + strconv.Itoa(d.nonces), removed: removed}
	delta := d.c.cfg.XDSProtocol == ProtocolDelta
	for i, a := range resources {
		r := rawResource{version: version, any: a}
		if delta && i < len(names) {
			r.name = names[i]
		}
		resp.resources = append(resp.resources, r)
	}
	sent := len(d.st.sent)
	if err := d.c.handleResponse(context.Background(), d.st, resp); err != nil {
		return "", err
	}
	if err := d.ApplyWatches(); err != nil {
		return "", err
	}
	for _, r := range d.st.sent[sent:] {
		if r.typeURL == typeURL && r.errorDetail != nil {
			return r.errorDetail.GetMessage(), nil
		}
	}
	return "", nil
}
