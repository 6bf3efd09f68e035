// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"errors"
	"github.com/cilium/hive/cell"

	"github.com/l4xds/l4xds/pkg/loadbalancer"
)

// Sink is where the controller writes the translation. The standalone agent
// writes l4xds's own tables (TablesSink); inside Cilium the cilium module's
// adapter writes Cilium's. Every rule of the translation is the
// controller's, so it holds for both.
type Sink interface {
	// WriteTxn begins the transaction of one xDS update.
	WriteTxn() SinkTxn
	// RegisterInitializer holds back pruning (of what a restarted datapath
	// restored) until done is called with the first full state.
	RegisterInitializer(name string) (done func(SinkTxn))
}

// SinkTxn is one transaction of a Sink; the controller commits it once per
// update. Its methods have the meaning of loadbalancer.Writer's: a frontend
// owned by another service is an error that wraps
// loadbalancer.ErrFrontendConflict, a service name another source has
// (inside Cilium, a Kubernetes Service's) one that wraps
// loadbalancer.ErrServiceOwned, and either leaves the service as it was.
type SinkTxn interface {
	UpsertServiceAndFrontends(svc *loadbalancer.Service, fes ...loadbalancer.FrontendParams) error
	// CheckFrontends returns the error UpsertServiceAndFrontends would
	// return for a frontend owned by another service, or for the service's
	// name owned by another source, and writes nothing.
	CheckFrontends(svc *loadbalancer.Service, fes ...loadbalancer.FrontendParams) error
	// DeleteServiceAndFrontends deletes a service that exists.
	DeleteServiceAndFrontends(name loadbalancer.ServiceName) error
	// SetBackends replaces the service's xDS backends; none deletes them.
	SetBackends(name loadbalancer.ServiceName, bes ...loadbalancer.BackendParams) error
	Commit()
}

// backendsOfMany is a SinkTxn that also sets the backends of many services
// at once, as loadbalancer.Writer.SetBackendsOf: errs[i] is the error of
// sets[i]. The controller gives it those of a whole EDS update (or slice of
// one); a SinkTxn without it gets them one SetBackends at a time.
type backendsOfMany interface {
	SetBackendsOf(sets []loadbalancer.ServiceBackends) (errs []error)
}

// newServiceWriter is a SinkTxn that also writes a service with its
// backends in one step, as UpsertThenSetBackends would. The controller
// gives it the held clusters (Controller.SetNewClusterWait); a SinkTxn
// without it gets UpsertThenSetBackends.
type newServiceWriter interface {
	UpsertNewService(svc *loadbalancer.Service, fes []loadbalancer.FrontendParams, bes []loadbalancer.BackendParams) error
}

// UpsertThenSetBackends writes a service and its frontends, then its
// backends. If the backends are refused the service goes again: a held
// cluster had written nothing, and its frontends would otherwise serve
// without backends and outlive it (deleteCluster deletes nothing of a
// held one).
func UpsertThenSetBackends(txn SinkTxn, svc *loadbalancer.Service, fes []loadbalancer.FrontendParams, bes []loadbalancer.BackendParams) error {
	if err := txn.UpsertServiceAndFrontends(svc, fes...); err != nil {
		return err
	}
	if err := txn.SetBackends(svc.Name, bes...); err != nil {
		return errors.Join(err, txn.DeleteServiceAndFrontends(svc.Name))
	}
	return nil
}

// TablesCell provides the standalone agent's Sink: l4xds's own tables.
var TablesCell = cell.Provide(NewTablesSink)

// NewTablesSink writes through w, as source loadbalancer.SourceXDS.
func NewTablesSink(w *loadbalancer.Writer) Sink { return tablesSink{w} }

type tablesSink struct{ w *loadbalancer.Writer }

func (s tablesSink) WriteTxn() SinkTxn { return tablesTxn{s.w, s.w.WriteTxn()} }

func (s tablesSink) RegisterInitializer(name string) func(SinkTxn) {
	done := s.w.RegisterInitializer(name)
	return func(txn SinkTxn) { done(txn.(tablesTxn).txn) }
}

type tablesTxn struct {
	w   *loadbalancer.Writer
	txn loadbalancer.WriteTxn
}

func (t tablesTxn) UpsertServiceAndFrontends(svc *loadbalancer.Service, fes ...loadbalancer.FrontendParams) error {
	return t.w.UpsertServiceAndFrontends(t.txn, svc, fes...)
}

func (t tablesTxn) CheckFrontends(svc *loadbalancer.Service, fes ...loadbalancer.FrontendParams) error {
	return t.w.CheckFrontends(t.txn, svc, fes...)
}

func (t tablesTxn) DeleteServiceAndFrontends(name loadbalancer.ServiceName) error {
	_, err := t.w.DeleteServiceAndFrontends(t.txn, name)
	return err
}

func (t tablesTxn) SetBackends(name loadbalancer.ServiceName, bes ...loadbalancer.BackendParams) error {
	return t.w.SetBackends(t.txn, name, loadbalancer.SourceXDS, bes...)
}

func (t tablesTxn) SetBackendsOf(sets []loadbalancer.ServiceBackends) []error {
	return t.w.SetBackendsOf(t.txn, loadbalancer.SourceXDS, sets)
}

func (t tablesTxn) Commit() { t.txn.Commit() }
