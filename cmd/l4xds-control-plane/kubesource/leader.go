// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Several replicas, one writer. Every replica watches the cluster and
// serves xDS from its own informers: agents reach any of them. Status and
// Events are written by one, the holder of a Lease (client-go's leader
// election), so that replicas never race on an object's status. Allocation
// is a function of the cluster's objects (the addresses they hold first),
// so every replica serves the same addresses before the leader has written
// them; a new leader writes what its predecessor had not, on its first
// round. Addresses are written from the status the leader knows: it reads
// the Services and Gateways afresh when it starts leading, and uses the
// objects its own writes return until its informers show them (see
// ownWrites), so that it never gives an address just written to one object
// to another.

// Election configures leader election. The zero Lease name disables it:
// the source always writes (one replica).
type Election struct {
	// Namespace and Name of the Lease.
	Namespace, Name string
	// Identity of this replica in the Lease (the pod's name).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod as client-go's; zero
	// takes the defaults below.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// Defaults of Election: those of kube-controller-manager.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// leadership is whether this replica writes status and Events.
type leadership struct{ leading atomic.Bool }

func (l *leadership) writes() bool { return l.leading.Load() }

// elect takes part in the election until ctx ends: a replica that loses
// the Lease stands again. changed is called when this replica starts or
// stops leading.
func (s *Source) elect(ctx context.Context, e Election, changed func()) error {
	d := func(v, def time.Duration) time.Duration {
		if v == 0 {
			return def
		}
		return v
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, e.Namespace, e.Name,
		s.kube.CoreV1(), s.kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: e.Identity})
	if err != nil {
		return fmt.Errorf("leader election Lease %s/%s: %w", e.Namespace, e.Name, err)
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          &reportingLock{Interface: lock, s: s, lease: e.Namespace + "/" + e.Name},
		LeaseDuration: d(e.LeaseDuration, DefaultLeaseDuration),
		RenewDeadline: d(e.RenewDeadline, DefaultRenewDeadline),
		RetryPeriod:   d(e.RetryPeriod, DefaultRetryPeriod),
		// A replica stopped on purpose hands over at once.
		ReleaseOnCancel: true,
		Name:            e.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				// client-go runs this in a goroutine: leadership may
				// already be over.
				if lctx.Err() != nil {
					return
				}
				s.log.Info("Leading: writing status and Events", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
				s.lead.leading.Store(true)
				changed()
			},
			OnStoppedLeading: func() {
				if s.lead.leading.Swap(false) {
					s.log.Info("No longer leading: serving xDS, not writing status", "lease", e.Namespace+"/"+e.Name)
					changed()
				}
			},
			OnNewLeader: func(id string) {
				if id != e.Identity {
					s.log.Info("Following", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	for ctx.Err() == nil {
		le.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}

// reportingLock says in the source's own log why the Lease cannot be read
// or written (its Role missing, the API server refusing), once per error:
// client-go's election only logs it in its own format, at every retry,
// while this replica writes no status.
type reportingLock struct {
	resourcelock.Interface
	s     *Source
	lease string

	mu   sync.Mutex
	last string
}

func (l *reportingLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	if !apierrors.IsNotFound(err) { // not there yet: Create follows
		l.report(err)
	}
	return r, raw, err
}

func (l *reportingLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, r)
	if !apierrors.IsAlreadyExists(err) { // another replica was first
		l.report(err)
	}
	return err
}

func (l *reportingLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, r)
	if !apierrors.IsConflict(err) { // another replica wrote it meanwhile
		l.report(err)
	}
	return err
}

func (l *reportingLock) report(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if msg == l.last {
		return
	}
	l.last = msg
	if err != nil {
		l.s.log.Warn("Leader election: the Lease cannot be read or written; no replica may be writing status",
			"lease", l.lease, "error", err)
	}
}
