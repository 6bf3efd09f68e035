// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/pflag"
)

// Protocol variants of the ADS stream.
const (
	ProtocolSotW  = "sotw"
	ProtocolDelta = "delta"
)

// Config of the xDS client. Field names match the flags (dashes removed)
// as hive's config decoding requires.
type Config struct {
	EnableXDSControlPlane bool
	XDSServerAddress      string
	XDSClientCertPath     string
	XDSClientKeyPath      string
	XDSCACertPath         string
	// XDSServerName is the name the server certificate must carry; the host
	// of XDSServerAddress when empty.
	XDSServerName string
	XDSInsecure   bool
	// XDSNodeID is the node id sent to the server; $NODE_NAME, else the
	// hostname, when empty.
	XDSNodeID      string
	XDSNodeCluster string
	// Locality of the node, sent to the server when any part is set.
	XDSNodeRegion                  string
	XDSNodeZone                    string
	XDSNodeSubZone                 string
	XDSProtocol                    string
	XDSMaxRecvMsgSize              int
	XDSResourceDoesNotExistTimeout time.Duration
}

// DefaultConfig is the configuration of a client nobody configured: disabled.
var DefaultConfig = Config{
	XDSNodeCluster:                 "l4xds",
	XDSProtocol:                    ProtocolSotW,
	XDSMaxRecvMsgSize:              64 << 20,
	XDSResourceDoesNotExistTimeout: 15 * time.Second,
}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-xds-control-plane", def.EnableXDSControlPlane, "Subscribe to an xDS management server")
	flags.String("xds-server-address", def.XDSServerAddress, "host:port of the xDS management server")
	flags.String("xds-client-cert-path", def.XDSClientCertPath, "PEM client certificate presented to the xDS server")
	flags.String("xds-client-key-path", def.XDSClientKeyPath, "PEM private key of the client certificate")
	flags.String("xds-ca-cert-path", def.XDSCACertPath, "PEM CA certificates that sign the xDS server certificate")
	flags.String("xds-server-name", def.XDSServerName, "Name the xDS server certificate must carry (default: host of --xds-server-address)")
	flags.Bool("xds-insecure", def.XDSInsecure, "Connect to the xDS server without TLS (testing only)")
	flags.String("xds-node-id", def.XDSNodeID, "Node id sent to the xDS server (default: $NODE_NAME, else the hostname)")
	flags.String("xds-node-cluster", def.XDSNodeCluster, "Node cluster sent to the xDS server")
	flags.String("xds-node-region", def.XDSNodeRegion, "Locality region sent to the xDS server")
	flags.String("xds-node-zone", def.XDSNodeZone, "Locality zone sent to the xDS server")
	flags.String("xds-node-sub-zone", def.XDSNodeSubZone, "Locality sub-zone sent to the xDS server")
	flags.String("xds-protocol", def.XDSProtocol, "xDS protocol variant: sotw or delta")
	flags.Int("xds-max-recv-msg-size", def.XDSMaxRecvMsgSize, "Largest xDS response accepted, in bytes")
	flags.Duration("xds-resource-does-not-exist-timeout", def.XDSResourceDoesNotExistTimeout,
		"How long a requested resource may stay unanswered before it is considered deleted")
}

// Validate checks the configuration; the server and its certificates only
// when xDS is enabled. Errors name the flag at fault.
func (cfg Config) Validate() error {
	var errs []error
	if cfg.EnableXDSControlPlane {
		errs = cfg.validateServer()
	}
	if cfg.XDSProtocol != ProtocolSotW && cfg.XDSProtocol != ProtocolDelta {
		errs = append(errs, fmt.Errorf("--xds-protocol: %q is not %s or %s", cfg.XDSProtocol, ProtocolSotW, ProtocolDelta))
	}
	if cfg.XDSMaxRecvMsgSize <= 0 {
		errs = append(errs, fmt.Errorf("--xds-max-recv-msg-size: %d is not a positive number of bytes", cfg.XDSMaxRecvMsgSize))
	}
	if cfg.XDSResourceDoesNotExistTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--xds-resource-does-not-exist-timeout: %s is not positive", cfg.XDSResourceDoesNotExistTimeout))
	}
	return errors.Join(errs...)
}

// validateServer checks what connecting to the server needs.
func (cfg Config) validateServer() (errs []error) {
	if cfg.XDSServerAddress == "" {
		errs = append(errs, errors.New("--xds-server-address: must be set when --enable-xds-control-plane is true"))
	} else if _, _, err := net.SplitHostPort(cfg.XDSServerAddress); err != nil {
		errs = append(errs, fmt.Errorf("--xds-server-address: %q is not host:port: %w", cfg.XDSServerAddress, err))
	}
	if cfg.XDSInsecure {
		return errs
	}
	for _, f := range []struct{ flag, value string }{
		{"--xds-client-cert-path", cfg.XDSClientCertPath},
		{"--xds-client-key-path", cfg.XDSClientKeyPath},
		{"--xds-ca-cert-path", cfg.XDSCACertPath},
	} {
		if f.value == "" {
			errs = append(errs, fmt.Errorf("%s: must be set unless --xds-insecure is true", f.flag))
		}
	}
	return errs
}

// serverName is the name the server certificate is checked against.
func (cfg Config) serverName() string {
	if cfg.XDSServerName != "" {
		return cfg.XDSServerName
	}
	host, _, err := net.SplitHostPort(cfg.XDSServerAddress)
	if err != nil {
		return cfg.XDSServerAddress
	}
	return host
}

// nodeID is the configured node id, else $NODE_NAME, else the hostname.
func (cfg Config) nodeID() string {
	if cfg.XDSNodeID != "" {
		return cfg.XDSNodeID
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "unknown"
}
