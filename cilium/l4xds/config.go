// SPDX-License-Identifier: Apache-2.0

package l4xds

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/l4xds/l4xds/cilium/sink"
	"github.com/l4xds/l4xds/pkg/l4lb"
	"github.com/l4xds/l4xds/pkg/xds"
)

// block is the CFP's configuration block as one Cilium setting: the
// cilium-config key `xds-control-plane` (Helm: extraConfig) holds the YAML
// block verbatim.
type block struct {
	XDSControlPlane string
}

var defaultBlock = block{}

func (def block) Flags(flags *pflag.FlagSet) {
	flags.String("xds-control-plane", def.XDSControlPlane,
		"The CFP's xds-control-plane block as YAML (enabled, server-address, client-cert-path, client-key-path, ca-cert-path, metadata-key, namespace, cluster, ...); an alternative to the --xds-* flags")
}

// cfpBlock lists the keys of the block: those of the CFP, those of the CFP
// author's prototype (metadata-key, namespace, cluster), then the other
// --xds-* settings under the same names.
type cfpBlock struct {
	Enabled                     *bool          `yaml:"enabled"`
	ServerAddress               *string        `yaml:"server-address"`
	ClientCertPath              *string        `yaml:"client-cert-path"`
	ClientKeyPath               *string        `yaml:"client-key-path"`
	CACertPath                  *string        `yaml:"ca-cert-path"`
	MetadataKey                 *string        `yaml:"metadata-key"`
	Namespace                   *string        `yaml:"namespace"`
	Cluster                     *string        `yaml:"cluster"`
	ServerName                  *string        `yaml:"server-name"`
	ServerFeatures              *string        `yaml:"server-features"`
	Insecure                    *bool          `yaml:"insecure"`
	NodeID                      *string        `yaml:"node-id"`
	NodeCluster                 *string        `yaml:"node-cluster"`
	NodeRegion                  *string        `yaml:"node-region"`
	NodeZone                    *string        `yaml:"node-zone"`
	NodeSubZone                 *string        `yaml:"node-sub-zone"`
	Protocol                    *string        `yaml:"protocol"`
	MaxRecvMsgSize              *int           `yaml:"max-recv-msg-size"`
	ResourceDoesNotExistTimeout *time.Duration `yaml:"resource-does-not-exist-timeout"`
	ConnectTimeout              *time.Duration `yaml:"connect-timeout"`
}

// applyBlock merges the block into the --xds-* settings of the client and
// of the translation. A key set both ways to different values is an error
// naming both, never a silent choice.
func applyBlock(cfg xds.Config, names l4lb.Config, b block) (xds.Config, l4lb.Config, error) {
	var blk cfpBlock
	if b.XDSControlPlane != "" {
		dec := yaml.NewDecoder(bytes.NewReader([]byte(b.XDSControlPlane)))
		dec.KnownFields(true)
		if err := dec.Decode(&blk); err != nil && !errors.Is(err, io.EOF) {
			return cfg, names, fmt.Errorf("xds-control-plane: %w", err)
		}
	}
	var errs []error
	merge(&errs, &names.XDSMetadataKey, blk.MetadataKey, l4lb.DefaultConfig.XDSMetadataKey, "metadata-key", "xds-metadata-key")
	merge(&errs, &names.XDSNamespace, blk.Namespace, l4lb.DefaultConfig.XDSNamespace, "namespace", "xds-namespace")
	merge(&errs, &names.XDSCluster, blk.Cluster, l4lb.DefaultConfig.XDSCluster, "cluster", "xds-cluster")
	// Inside Cilium every service has a namespace, xds unless the
	// metadata or the settings name another; empty is the default, as in
	// the CFP author's prototype.
	if names.XDSNamespace == "" {
		names.XDSNamespace = sink.Namespace
	}
	merge(&errs, &cfg.EnableXDSControlPlane, blk.Enabled, xds.DefaultConfig.EnableXDSControlPlane, "enabled", "enable-xds-control-plane")
	merge(&errs, &cfg.XDSServerAddress, blk.ServerAddress, xds.DefaultConfig.XDSServerAddress, "server-address", "xds-server-address")
	merge(&errs, &cfg.XDSClientCertPath, blk.ClientCertPath, xds.DefaultConfig.XDSClientCertPath, "client-cert-path", "xds-client-cert-path")
	merge(&errs, &cfg.XDSClientKeyPath, blk.ClientKeyPath, xds.DefaultConfig.XDSClientKeyPath, "client-key-path", "xds-client-key-path")
	merge(&errs, &cfg.XDSCACertPath, blk.CACertPath, xds.DefaultConfig.XDSCACertPath, "ca-cert-path", "xds-ca-cert-path")
	merge(&errs, &cfg.XDSServerName, blk.ServerName, xds.DefaultConfig.XDSServerName, "server-name", "xds-server-name")
	merge(&errs, &cfg.XDSServerFeatures, blk.ServerFeatures, xds.DefaultConfig.XDSServerFeatures, "server-features", "xds-server-features")
	merge(&errs, &cfg.XDSInsecure, blk.Insecure, xds.DefaultConfig.XDSInsecure, "insecure", "xds-insecure")
	merge(&errs, &cfg.XDSNodeID, blk.NodeID, xds.DefaultConfig.XDSNodeID, "node-id", "xds-node-id")
	merge(&errs, &cfg.XDSNodeCluster, blk.NodeCluster, xds.DefaultConfig.XDSNodeCluster, "node-cluster", "xds-node-cluster")
	merge(&errs, &cfg.XDSNodeRegion, blk.NodeRegion, xds.DefaultConfig.XDSNodeRegion, "node-region", "xds-node-region")
	merge(&errs, &cfg.XDSNodeZone, blk.NodeZone, xds.DefaultConfig.XDSNodeZone, "node-zone", "xds-node-zone")
	merge(&errs, &cfg.XDSNodeSubZone, blk.NodeSubZone, xds.DefaultConfig.XDSNodeSubZone, "node-sub-zone", "xds-node-sub-zone")
	merge(&errs, &cfg.XDSProtocol, blk.Protocol, xds.DefaultConfig.XDSProtocol, "protocol", "xds-protocol")
	merge(&errs, &cfg.XDSMaxRecvMsgSize, blk.MaxRecvMsgSize, xds.DefaultConfig.XDSMaxRecvMsgSize, "max-recv-msg-size", "xds-max-recv-msg-size")
	merge(&errs, &cfg.XDSResourceDoesNotExistTimeout, blk.ResourceDoesNotExistTimeout, xds.DefaultConfig.XDSResourceDoesNotExistTimeout, "resource-does-not-exist-timeout", "xds-resource-does-not-exist-timeout")
	merge(&errs, &cfg.XDSConnectTimeout, blk.ConnectTimeout, xds.DefaultConfig.XDSConnectTimeout, "connect-timeout", "xds-connect-timeout")
	return cfg, names, errors.Join(errs...)
}

// merge sets *field from the block's value unless the flag already set it
// (differs from the default) to something else.
func merge[T comparable](errs *[]error, field *T, val *T, def T, key, flag string) {
	if val == nil {
		return
	}
	if *field != def && *field != *val {
		*errs = append(*errs, fmt.Errorf("xds-control-plane: %s is %v but --%s is %v: set it once", key, *val, flag, *field))
		return
	}
	*field = *val
}
