// SPDX-License-Identifier: Apache-2.0

package kubesource

import "fmt"

// Defaults of the source's settings; Documentation/loadbalancer.md lists them.
const (
	DefaultLoadBalancerClass = "l4xds.io/l4lb"
	DefaultControllerName    = "l4xds.io/gateway-controller"
)

// Annotations of Services (and, for the address ones, of Gateways).
const (
	// AnnotationAddresses asks for specific addresses, comma separated, at
	// most one per IP family; each must be in a pool. Like
	// spec.loadBalancerIP, which it takes precedence over.
	AnnotationAddresses = "l4xds.io/load-balancer-ips"
	// AnnotationPool names the pool to allocate from.
	AnnotationPool = "l4xds.io/address-pool"
	// AnnotationSharingKey lets Services with the same key share an address
	// when no port and protocol of theirs overlap.
	AnnotationSharingKey = "l4xds.io/sharing-key"
	// AnnotationBackendMode overrides --backend-mode for one Service.
	AnnotationBackendMode = "l4xds.io/backend-mode"
)

// BackendMode is where a Service's traffic is sent.
type BackendMode string

const (
	// PodBackends sends traffic to the pod addresses of the EndpointSlices:
	// the load balancer nodes must route to pods.
	PodBackends BackendMode = "pod"
	// NodePortBackends sends traffic to the nodes' InternalIP at the
	// Service's nodePort ("instance mode"); kube-proxy (or Cilium) takes it
	// from there. NotReady nodes are UNHEALTHY.
	NodePortBackends BackendMode = "node-port"
)

func parseBackendMode(s string) (BackendMode, error) {
	switch m := BackendMode(s); m {
	case PodBackends, NodePortBackends:
		return m, nil
	}
	return "", fmt.Errorf("backend mode %q: want %q or %q", s, PodBackends, NodePortBackends)
}

// Config is what the source serves and how.
type Config struct {
	// LoadBalancerClass is the spec.loadBalancerClass of the Services this
	// source serves. Services of any other class, or none, are not touched.
	LoadBalancerClass string
	// ControllerName is the GatewayClass spec.controllerName this source
	// implements.
	ControllerName string
	// BackendMode is the default backend mode.
	BackendMode BackendMode
	// Pools are the addresses to give out.
	Pools Pools
	// KeepHeldAddresses keeps the addresses objects hold though no pool
	// has them: set while some pools are not known (their ConfigMap does
	// not parse), so that no object loses or changes its address meanwhile.
	KeepHeldAddresses bool
}

func (c Config) withDefaults() Config {
	if c.LoadBalancerClass == "" {
		c.LoadBalancerClass = DefaultLoadBalancerClass
	}
	if c.ControllerName == "" {
		c.ControllerName = DefaultControllerName
	}
	if c.BackendMode == "" {
		c.BackendMode = PodBackends
	}
	return c
}
