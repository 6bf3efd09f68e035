// SPDX-License-Identifier: Apache-2.0

package l4lb

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Config says which clusters are ours and how their services are named.
// Field names match the flags (dashes removed) as hive's config decoding
// requires.
type Config struct {
	// XDSMetadataKey is the filter_metadata key of our clusters and of the
	// endpoint metadata we read.
	XDSMetadataKey string
	// XDSNamespace and XDSCluster qualify the service names, unless a
	// cluster's metadata sets its own: "[cluster/]namespace/service", as
	// Cilium names services. Without a namespace a service is named after
	// its cluster alone.
	XDSNamespace string
	XDSCluster   string
}

// DefaultConfig reads io.cilium.l4lb and names each service after its
// cluster.
var DefaultConfig = Config{XDSMetadataKey: MetadataKey}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.String("xds-metadata-key", def.XDSMetadataKey,
		"filter_metadata key that makes an xDS cluster an L4 load balancer; endpoints' zone and nodeName are read under it too")
	flags.String("xds-namespace", def.XDSNamespace,
		"Namespace of the services' names (namespace/service) unless a cluster's metadata sets namespace; empty: a service is named after its cluster alone (inside Cilium: xds)")
	flags.String("xds-cluster", def.XDSCluster,
		"Cluster of the services' names (cluster/namespace/service, as Cilium's ClusterMesh names services) unless a cluster's metadata sets cluster; not the node's cluster (--xds-node-cluster)")
}

// Validate checks the configuration. Errors name the flag at fault.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.XDSMetadataKey == "" {
		errs = append(errs, errors.New("--xds-metadata-key: must not be empty"))
	}
	if err := namePart(cfg.XDSNamespace); err != nil {
		errs = append(errs, fmt.Errorf("--xds-namespace: %w", err))
	}
	if err := namePart(cfg.XDSCluster); err != nil {
		errs = append(errs, fmt.Errorf("--xds-cluster: %w", err))
	}
	if cfg.XDSCluster != "" && cfg.XDSNamespace == "" {
		errs = append(errs, fmt.Errorf("--xds-cluster: %q needs a namespace (--xds-namespace)", cfg.XDSCluster))
	}
	return errors.Join(errs...)
}

// namePart checks a part of a qualified service name: the separator would
// make the name ambiguous.
func namePart(s string) error {
	if strings.ContainsAny(s, "/\x00") {
		return fmt.Errorf("%q contains a slash or a NUL byte", s)
	}
	return nil
}
