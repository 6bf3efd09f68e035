// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"slices"
	"strconv"
	"testing"
)

// TestInSlices: an InSlices handler gets a large response in several calls,
// each resource in exactly one of them and whole; the offer of a resource
// rejected earlier comes with the last call, unless an earlier slice of the
// same response carried the resource; removals come last; the response is
// answered once.
func TestInSlices(t *testing.T) {
	for _, p := range []string{ProtocolSotW, ProtocolDelta} {
		t.Run(p, func(t *testing.T) {
			rc := newRuleClient(t, p)
			rc.types[EndpointType].sliced = true
			SetSliceBytes(t, 1, 1) // a resource per slice
			rc.setNames("e1", "e2", "e3")

			// e2 is rejected (priority 9) and held as an offer.
			rc.respond(EndpointType, "1", nil, rc.cla("e1", 0), rc.cla("e2", 9), rc.cla("e3", 0))
			if got := calls(rc.eps.updates); !sameCalls(got, [][]string{{"e1"}, {"e2"}, {"e3"}}) {
				t.Fatalf("calls of the first response = %q, want one per resource", got)
			}
			if r := rc.lastRequest(EndpointType); r.errorDetail == nil || r.nonce != rc.lastNonce {
				t.Fatalf("answer = %+v, want a NACK of e2", r)
			}
			sent := len(rc.sentRequests())

			// e2 fixed in the first slice, e1 changed in the second: e2's
			// old offer must not follow it.
			n := len(rc.eps.updates)
			rc.respond(EndpointType, "2", nil, rc.cla("e2", 0), rc.cla("e1", 1), rc.cla("e3", 0))
			if got := calls(rc.eps.updates[n:]); !sameCalls(got, [][]string{{"e2"}, {"e1"}}) {
				t.Errorf("calls of the second response = %q, want e2, then e1 (e3 unchanged, no offer)", got)
			}
			if rc.eps.held["e2"] != "p0" {
				t.Errorf("e2 held as %q, want p0", rc.eps.held["e2"])
			}
			if got := rc.sentRequests()[sent:]; len(got) != 1 || got[0].errorDetail != nil || got[0].nonce != rc.lastNonce {
				t.Errorf("answers = %+v, want one ACK", got)
			}
			for _, name := range []string{"e1", "e2", "e3"} {
				if s := rc.resource(EndpointType, name).State; s != StateAcked {
					t.Errorf("%s is %s, want acked", name, s)
				}
			}

			// A Delta removal comes with the last slice.
			if rc.delta {
				n = len(rc.eps.updates)
				rc.respond(EndpointType, "3", []string{"e3"}, rc.cla("e1", 2), rc.cla("e2", 1))
				last := rc.eps.updates[len(rc.eps.updates)-1]
				if got := calls(rc.eps.updates[n:]); !sameCalls(got, [][]string{{"e1"}, {"e2"}}) || !slices.Equal(last.Removed, []string{"e3"}) {
					t.Errorf("calls of the third response = %q, last removes %q; want e1, then e2 with e3 removed", got, last.Removed)
				}
			}
		})
	}
}

// calls are the names upserted by each update.
func calls(us []Update) [][]string {
	var out [][]string
	for _, u := range us {
		out = append(out, names(u.Upserted))
	}
	return out
}

func sameCalls(got, want [][]string) bool { return slices.EqualFunc(got, want, slices.Equal[[]string]) }

// TestInSlicesGrow: to an InGrowingSlices handler, a response's first slice
// is the smallest, each next one twice the last up to the most, so that the
// handler gets the first resources soon and a large response in few calls.
func TestInSlicesGrow(t *testing.T) {
	rc := newRuleClient(t, ProtocolSotW)
	rc.types[EndpointType].sliced, rc.types[EndpointType].growing = true, true
	var names []string
	var res []rawResource
	for i := range 10 { // names of one length: resources of one size
		n := "e" + strconv.Itoa(i)
		names = append(names, n)
		res = append(res, rc.cla(n, 0))
	}
	size := len(res[0].any.GetValue())
	for _, r := range res {
		if len(r.any.GetValue()) != size {
			t.Fatalf("resources of %d and %d bytes, want one size", size, len(r.any.GetValue()))
		}
	}
	SetSliceBytes(t, size, 4*size)
	rc.setNames(names...)
	rc.respond(EndpointType, "1", nil, res...)
	var got []int
	for _, u := range rc.eps.updates {
		got = append(got, len(u.Upserted))
	}
	if want := []int{1, 2, 4, 3}; !slices.Equal(got, want) {
		t.Errorf("slices of %v resources, want %v", got, want)
	}
}
