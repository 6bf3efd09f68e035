// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
	gwinformers "sigs.k8s.io/gateway-api/pkg/client/informers/externalversions"

	"github.com/l4xds/l4xds/pkg/controlplane"
)

// SourceName is the name of this source among the control plane's sources.
const SourceName = "kubernetes"

// Options of a Source.
type Options struct {
	Config
	// PoolsConfigMap ("NAMESPACE/NAME") holds more pools, one per key:
	// the key is the pool's name, the value its ranges as in ParsePool.
	PoolsConfigMap string
	// Publish receives the resources on every change that alters them.
	Publish func(controlplane.Resources) ([]controlplane.Conflict, error)
	// Problem, when set, receives why the source does not publish the
	// cluster's complete state (the API server does not answer, a kind of
	// object cannot be listed, the pools ConfigMap is invalid), and nil
	// once it does.
	Problem func(error)
	// Election makes this one of several replicas: only the holder of
	// the Lease writes status and Events. Without a Lease name the source
	// always writes.
	Election Election
	Logger   *slog.Logger
	// Registerer, when set, gets the pools' usage
	// (l4xds_control_plane_pool_addresses and ..._allocated).
	Registerer prometheus.Registerer
}

// Source watches a cluster and publishes its Services and Gateway API
// routes as l4xds clusters, and writes their status.
type Source struct {
	opts Options
	log  *slog.Logger
	kube kubernetes.Interface
	gw   gwclient.Interface // nil when the cluster has no Gateway API (known in Run)
	rec  record.EventRecorder
	lead leadership
	pool *poolMetrics

	problem string // last reported
}

// RESTConfig is the configuration of kubeconfig, or the in-cluster one
// when kubeconfig is "".
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster Kubernetes configuration (give --kubeconfig outside a cluster): %w", err)
		}
		return withRate(cfg), nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return withRate(cfg), nil
}

// withRate raises client-go's default of 5 requests a second (burst 10):
// a round writes the status of every object whose status changed, and
// after an install or a pool change that is every Service; at 5 a second
// 500 of them take 100 s, and the next publish waits for them.
func withRate(cfg *rest.Config) *rest.Config {
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 50, 100
	}
	return cfg
}

// New makes the clients of the API server of cfg; it does not contact it.
func New(cfg *rest.Config, opts Options) (*Source, error) {
	opts.Config = opts.Config.withDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	gw, err := gwclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("gateway API client: %w", err)
	}
	s := &Source{opts: opts, log: opts.Logger, kube: kube, gw: gw, pool: newPoolMetrics()}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(s.pool); err != nil {
			return nil, fmt.Errorf("address pool metrics: %w", err)
		}
	}
	return s, nil
}

// report logs a problem when it changes and passes it to Options.Problem.
func (s *Source) report(err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == s.problem {
		return
	}
	s.problem = msg
	if err != nil {
		s.log.Warn("Kubernetes state not served yet", "reason", msg)
	}
	if s.opts.Problem != nil {
		s.opts.Problem(err)
	}
}

// gatewayAPIServed asks the API server whether it serves the Gateway API.
// Only a "not found" is a no: a server that does not answer is asked again,
// as serving without the Gateways would remove their listeners from every
// client.
func (s *Source) gatewayAPIServed(ctx context.Context) (bool, error) {
	gv := gatewayv1.GroupVersion
	err := s.kube.Discovery().RESTClient().Get().AbsPath("/apis", gv.Group, gv.Version).Do(ctx).Error()
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// discover sets s.gw to nil when the cluster serves no Gateway API. It
// retries until the API server answers; false when ctx ended first.
func (s *Source) discover(ctx context.Context) bool {
	if s.gw == nil {
		return true // known
	}
	delay := time.Second
	s.report(errors.New("waiting for the API server to answer (is the Gateway API served?)"))
	for {
		ok, err := s.gatewayAPIServed(ctx)
		if err == nil {
			if !ok {
				s.log.Info("The cluster serves no Gateway API (gateway.networking.k8s.io/v1): serving Services only")
				s.gw = nil
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		s.report(fmt.Errorf("asking the API server whether it serves the Gateway API: %w", err))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}

// informer is one kind of object the source lists and watches, with the
// last error of its watch (why it has not synced).
type informer struct {
	kind string
	inf  cache.SharedIndexInformer

	mu      sync.Mutex
	lastErr error
}

func (i *informer) watchError(ctx context.Context, r *cache.Reflector, err error) {
	i.mu.Lock()
	i.lastErr = err
	i.mu.Unlock()
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

func (i *informer) pending() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.lastErr == nil {
		return i.kind + " (not listed yet)"
	}
	return fmt.Sprintf("%s (%v)", i.kind, i.lastErr)
}

// waitForSync waits until every informer has listed its objects, reporting
// the ones that have not; false when ctx ended first.
func (s *Source) waitForSync(ctx context.Context, infs []*informer) bool {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		var pending []string
		for _, i := range infs {
			if !i.inf.HasSynced() {
				pending = append(pending, i.pending())
			}
		}
		if len(pending) == 0 {
			return true
		}
		s.report(fmt.Errorf("waiting for the API server to list %s", strings.Join(pending, ", ")))
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// Run watches the cluster and publishes its state on every change until ctx
// is done (then it returns nil), or returns the error that prevents it
// from starting.
func (s *Source) Run(ctx context.Context) error {
	if !s.discover(ctx) {
		return nil
	}
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.kube.CoreV1().Events("")})
	defer bc.Shutdown()
	sch := runtime.NewScheme()
	_ = scheme.AddToScheme(sch)
	s.rec = bc.NewRecorder(sch, corev1.EventSource{Component: "l4xds-control-plane"})

	trigger := make(chan struct{}, 1)
	kick := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	if s.opts.Election.Name == "" {
		s.lead.leading.Store(true)
	} else {
		// The election ends with Run, before the informers it shares
		// nothing with: its own context, cancelled and waited for here.
		ectx, stopElection := context.WithCancel(ctx)
		elected := make(chan struct{})
		go func() {
			defer close(elected)
			if err := s.elect(ectx, s.opts.Election, kick); err != nil {
				s.log.Error("Not taking part in the leader election: this replica serves xDS and never writes status", "error", err)
			}
		}()
		defer func() {
			stopElection()
			<-elected
		}()
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { kick() },
		UpdateFunc: func(any, any) { kick() },
		DeleteFunc: func(any) { kick() },
	}
	const resync = 10 * time.Minute
	f := informers.NewSharedInformerFactory(s.kube, resync)
	var infs []*informer
	watch := func(kind string, inf cache.SharedIndexInformer) error {
		i := &informer{kind: kind, inf: inf}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
		if err := inf.SetWatchErrorHandlerWithContext(i.watchError); err != nil {
			return err
		}
		infs = append(infs, i)
		return nil
	}
	svcs, slices_, nodes := f.Core().V1().Services(), f.Discovery().V1().EndpointSlices(), f.Core().V1().Nodes()
	for _, err := range []error{watch("Services", svcs.Informer()), watch("EndpointSlices", slices_.Informer()), watch("Nodes", nodes.Informer())} {
		if err != nil {
			return err
		}
	}
	var cms informers.SharedInformerFactory
	var cmNS, cmName string
	if s.opts.PoolsConfigMap != "" {
		var ok bool
		cmNS, cmName, ok = strings.Cut(s.opts.PoolsConfigMap, "/")
		if !ok || cmNS == "" || cmName == "" {
			return fmt.Errorf("address pools ConfigMap %q: want NAMESPACE/NAME", s.opts.PoolsConfigMap)
		}
		cms = informers.NewSharedInformerFactoryWithOptions(s.kube, resync, informers.WithNamespace(cmNS))
		if err := watch("ConfigMaps in "+cmNS, cms.Core().V1().ConfigMaps().Informer()); err != nil {
			return err
		}
	}
	var gf gwinformers.SharedInformerFactory
	if s.gw != nil {
		gf = gwinformers.NewSharedInformerFactory(s.gw, resync)
		g := gf.Gateway().V1()
		for _, err := range []error{
			watch("GatewayClasses", g.GatewayClasses().Informer()), watch("Gateways", g.Gateways().Informer()),
			watch("TCPRoutes", g.TCPRoutes().Informer()), watch("UDPRoutes", g.UDPRoutes().Informer()),
		} {
			if err != nil {
				return err
			}
		}
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if cms != nil {
		cms.Start(ctx.Done())
		defer cms.Shutdown()
	}
	if gf != nil {
		gf.Start(ctx.Done())
		defer gf.Shutdown()
	}
	// Nothing is published before every kind is listed: a partial state
	// would remove the rest from every client.
	if !s.waitForSync(ctx, infs) {
		return nil
	}

	read := func() (State, error) {
		var st State
		var err error
		if st.Services, err = svcs.Lister().List(labels.Everything()); err != nil {
			return st, err
		}
		if st.EndpointSlices, err = slices_.Lister().List(labels.Everything()); err != nil {
			return st, err
		}
		if st.Nodes, err = nodes.Lister().List(labels.Everything()); err != nil {
			return st, err
		}
		if gf != nil {
			g := gf.Gateway().V1()
			st.Gateway.Classes, _ = g.GatewayClasses().Lister().List(labels.Everything())
			st.Gateway.Gateways, _ = g.Gateways().Lister().List(labels.Everything())
			st.Gateway.TCPRoutes, _ = g.TCPRoutes().Lister().List(labels.Everything())
			st.Gateway.UDPRoutes, _ = g.UDPRoutes().Lister().List(labels.Everything())
		}
		return st, nil
	}

	// The ConfigMap's pools. One that does not parse keeps its last good
	// pools; with none (it was bad from the start), the flags' pools serve
	// and every object keeps the address it holds, since it may be in the
	// pools not known.
	var (
		goodCMPools Pools
		goodCM      bool
		lastPoolErr string
	)
	pools := func() (Pools, error) {
		out := slices.Clone(s.opts.Pools)
		if cms == nil {
			return out, nil
		}
		cm, err := cms.Core().V1().ConfigMaps().Lister().ConfigMaps(cmNS).Get(cmName)
		if err != nil {
			// No ConfigMap: no more pools, a good state. One created
			// with an error later keeps it: every replica reads the same
			// ConfigMap, and none must turn not ready for it.
			goodCMPools, goodCM, lastPoolErr = nil, true, ""
			return out, nil
		}
		more, perr := PoolsFromConfigMap(cm.Data)
		if perr == nil {
			goodCMPools, goodCM, lastPoolErr = more, true, ""
			return append(out, more...), nil
		}
		perr = fmt.Errorf("address pools ConfigMap %s: %w", s.opts.PoolsConfigMap, perr)
		if perr.Error() != lastPoolErr {
			lastPoolErr = perr.Error()
			how := "serving its last good pools"
			if !goodCM {
				how = "serving the --address-pool pools; objects keep the addresses they hold"
			}
			s.log.Error("Address pools not applied", "error", perr, "meanwhile", how)
			if s.lead.writes() {
				s.rec.Event(cm, corev1.EventTypeWarning, "InvalidAddressPools", perr.Error()+": "+how)
			}
		}
		if goodCM {
			return append(out, goodCMPools...), nil
		}
		return out, perr
	}

	first := true
	for {
		st, err := read()
		if err != nil {
			s.log.Error("Kubernetes state not applied", "error", err)
		} else {
			cfg := s.opts.Config
			var poolErr error
			cfg.Pools, poolErr = pools()
			cfg.KeepHeldAddresses = poolErr != nil
			out := Build(cfg, st)
			s.pool.set(out.Pools)
			_, err := s.opts.Publish(out.Resources)
			if err != nil {
				s.log.Error("Publishing the Kubernetes resources", "error", err)
			}
			if s.lead.writes() {
				s.writeStatus(ctx, st, out)
			}
			if first {
				s.log.Info("Kubernetes source synced", "services", len(out.Services), "resources", out.Resources.Len())
				first = false
			}
			// Not ready while pools are unknown: nothing new can get an
			// address from them.
			s.report(poolErr)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
		}
	}
}

// PoolsFromConfigMap reads pools from a ConfigMap's data: one key per pool,
// its ranges as the value (comma or newline separated).
func PoolsFromConfigMap(data map[string]string) (Pools, error) {
	var out Pools
	for _, name := range slices.Sorted(maps.Keys(data)) {
		v := strings.Join(strings.Fields(strings.ReplaceAll(data[name], ",", " ")), ",")
		p, err := ParsePool(name + "=" + v)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// writeStatus writes the status of the objects whose status differs from
// what the outcome says, and records the outcome's Events on them.
func (s *Source) writeStatus(ctx context.Context, st State, out Outcome) {
	for _, svc := range st.Services {
		k := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
		so, ok := out.Services[k]
		if !ok {
			continue
		}
		if equality.Semantic.DeepEqual(svc.Status, so.Status) {
			continue
		}
		upd := svc.DeepCopy()
		upd.Status = so.Status
		if !s.lead.writes() {
			return // leadership lost mid-round: the new leader writes
		}
		if _, err := s.kube.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			s.statusError("Service", k, err)
			continue
		}
		for _, e := range so.Events {
			s.rec.Event(svc, e.Type, e.Reason, e.Message)
		}
	}
	s.writeGatewayStatus(ctx, st.Gateway, out.Gateway)
}

// statusError logs a failed status write; the next change of the object
// (or the periodic resync) retries it.
func (s *Source) statusError(kind string, k types.NamespacedName, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.log.Warn("Writing status (retried on the next change)", "kind", kind, "name", k.String(), "error", err)
}

func (s *Source) writeGatewayStatus(ctx context.Context, st GatewayState, out GatewayOutcome) {
	if s.gw == nil {
		return
	}
	g := s.gw.GatewayV1()
	for _, gc := range st.Classes {
		want, ok := out.Classes[gc.Name]
		if !ok || equality.Semantic.DeepEqual(gc.Status, want) {
			continue
		}
		upd := gc.DeepCopy()
		upd.Status = want
		if !s.lead.writes() {
			return // leadership lost mid-round: the new leader writes
		}
		if _, err := g.GatewayClasses().UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			s.statusError("GatewayClass", types.NamespacedName{Name: gc.Name}, err)
		}
	}
	for _, gw := range st.Gateways {
		k := types.NamespacedName{Namespace: gw.Namespace, Name: gw.Name}
		want, ok := out.Gateways[k]
		if !ok || equality.Semantic.DeepEqual(gw.Status, want) {
			continue
		}
		upd := gw.DeepCopy()
		upd.Status = want
		if !s.lead.writes() {
			return // leadership lost mid-round: the new leader writes
		}
		if _, err := g.Gateways(gw.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			s.statusError("Gateway", k, err)
			continue
		}
		for _, e := range out.GatewayEvent[k] {
			s.rec.Event(gw, e.Type, e.Reason, e.Message)
		}
	}
	for _, r := range st.TCPRoutes {
		k := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
		want, ok := out.TCPRoutes[k]
		if !ok {
			continue
		}
		parents := mergeParents(r.Status.Parents, want, s.opts.ControllerName)
		if equality.Semantic.DeepEqual(r.Status.Parents, parents) {
			continue
		}
		upd := r.DeepCopy()
		upd.Status.Parents = parents
		if !s.lead.writes() {
			return // leadership lost mid-round: the new leader writes
		}
		if _, err := g.TCPRoutes(r.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			s.statusError("TCPRoute", k, err)
		}
	}
	for _, r := range st.UDPRoutes {
		k := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
		want, ok := out.UDPRoutes[k]
		if !ok {
			continue
		}
		parents := mergeParents(r.Status.Parents, want, s.opts.ControllerName)
		if equality.Semantic.DeepEqual(r.Status.Parents, parents) {
			continue
		}
		upd := r.DeepCopy()
		upd.Status.Parents = parents
		if !s.lead.writes() {
			return // leadership lost mid-round: the new leader writes
		}
		if _, err := g.UDPRoutes(r.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			s.statusError("UDPRoute", k, err)
		}
	}
}

// mergeParents keeps the parents of other controllers and replaces ours.
func mergeParents(old, ours []gatewayv1.RouteParentStatus, controller string) []gatewayv1.RouteParentStatus {
	var out []gatewayv1.RouteParentStatus
	for _, p := range old {
		if string(p.ControllerName) != controller {
			out = append(out, p)
		}
	}
	out = append(out, ours...)
	if len(out) == 0 {
		return old
	}
	return out
}
