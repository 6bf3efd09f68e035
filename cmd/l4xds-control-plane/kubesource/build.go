// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/l4xds/l4xds/pkg/controlplane"
)

// State is what the source reads from the cluster.
type State struct {
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	Nodes          []*corev1.Node
	Gateway        GatewayState
}

// Outcome is what the cluster's state makes: the xDS resources to serve,
// and the status of the objects of this source.
type Outcome struct {
	Resources controlplane.Resources
	Services  map[types.NamespacedName]ServiceOutcome
	Gateway   GatewayOutcome
	// Pools is how many addresses each pool has and how many are held.
	Pools []PoolUsage
}

// Build computes the outcome of a state. It is a pure function of st (the
// current status of the objects included: an object keeps the address its
// status has while it may), so that recomputing it on every change
// publishes exactly what the cluster says.
func Build(cfg Config, st State) Outcome {
	cfg = cfg.withDefaults()
	out := Outcome{Resources: controlplane.Resources{}, Services: map[types.NamespacedName]ServiceOutcome{}}
	al := newAllocator(cfg.Pools)
	al.keepHeld = cfg.KeepHeldAddresses

	var svcs []*corev1.Service
	for _, s := range st.Services {
		if cfg.ours(s) {
			svcs = append(svcs, s)
		}
	}
	slices.SortFunc(svcs, func(a, b *corev1.Service) int { return byAge(a, b) })
	// Addresses in rounds, each over all Services then all Gateways, oldest
	// first: every address held is kept before any is asked for or given
	// out, so that nothing takes an address another object holds.
	svcWork := planServices(svcs)
	gwWork := planGateways(cfg.ourGateways(st.Gateway))
	for _, w := range svcWork {
		w.keepHeld(al)
	}
	for _, w := range gwWork {
		w.keepHeld(al)
	}
	for _, w := range svcWork {
		w.takeRequested(al)
	}
	for _, w := range gwWork {
		w.takeRequested(al)
	}
	for _, w := range svcWork {
		w.takeNew(al)
	}
	for _, w := range gwWork {
		w.takeNew(al)
	}

	out.Pools = al.usage()

	idx := indexSlices(st.EndpointSlices)
	var clusters []*l4Cluster
	for _, w := range svcWork {
		cl, so := cfg.translateService(w, idx, st.Nodes)
		out.Services[types.NamespacedName{Namespace: w.svc.Namespace, Name: w.svc.Name}] = so
		if cl != nil {
			clusters = append(clusters, cl)
		}
	}
	gwClusters, gwOut := cfg.translateGateways(gwWork, st.Gateway, st.Services, idx)
	out.Gateway = gwOut
	clusters = append(clusters, gwClusters...)

	for _, cl := range clusters {
		c, cla := cl.resources()
		// Names are unique: one per Service, one per Gateway listener.
		if err := out.Resources.Add(c); err != nil {
			panic(err)
		}
		if err := out.Resources.Add(cla); err != nil {
			panic(err)
		}
	}
	return out
}
