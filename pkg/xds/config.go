// SPDX-License-Identifier: Apache-2.0

package xds

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
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
	// XDSServerAddress is the servers' host:port, comma-separated, in
	// order of priority (gRFC A71): the first that delivers is used.
	XDSServerAddress  string
	XDSClientCertPath string
	XDSClientKeyPath  string
	XDSCACertPath     string
	// XDSServerName is the name the server certificates must carry: empty
	// (each server's host), one name for every server, or one per server
	// in the order of XDSServerAddress (an empty one is that server's host).
	XDSServerName string
	// XDSServerFeatures are the servers' features (gRFC A30): empty, one
	// list for every server, or one per server in the order of
	// XDSServerAddress; a list's features are joined by "+".
	XDSServerFeatures string
	XDSInsecure       bool
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
	// XDSConnectTimeout bounds an attempt on a server: the connection, the
	// TLS handshake, the stream and its first response. A server that
	// accepts and never answers is then a failed server, not a hang.
	XDSConnectTimeout time.Duration
}

// DefaultConfig is the configuration of a client nobody configured: disabled.
var DefaultConfig = Config{
	XDSNodeCluster:                 "l4xds",
	XDSProtocol:                    ProtocolSotW,
	XDSMaxRecvMsgSize:              64 << 20,
	XDSResourceDoesNotExistTimeout: 15 * time.Second,
	XDSConnectTimeout:              15 * time.Second,
}

// Flags implements cell.Flagger.
func (def Config) Flags(flags *pflag.FlagSet) {
	flags.Bool("enable-xds-control-plane", def.EnableXDSControlPlane, "Subscribe to an xDS management server")
	flags.String("xds-server-address", def.XDSServerAddress,
		"host:port of the xDS management server; several, comma-separated, in order of priority: the first that delivers is used (gRFC A71)")
	flags.String("xds-client-cert-path", def.XDSClientCertPath, "PEM client certificate presented to the xDS server")
	flags.String("xds-client-key-path", def.XDSClientKeyPath, "PEM private key of the client certificate")
	flags.String("xds-ca-cert-path", def.XDSCACertPath, "PEM CA certificates that sign the xDS server certificate")
	flags.String("xds-server-name", def.XDSServerName,
		"Name the xDS server certificate must carry (default: host of --xds-server-address); one for every server, or one per server in the order of --xds-server-address")
	flags.String("xds-server-features", def.XDSServerFeatures,
		"Features of the xDS servers (gRFC A30): "+FeatureIgnoreResourceDeletion+" keeps resources the server deletes (gRFC A53); "+
			"one list for every server, or one per server in the order of --xds-server-address; a list's features joined by +")
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
	flags.Duration("xds-connect-timeout", def.XDSConnectTimeout,
		"How long an attempt on an xDS server may take to connect and send its first response before the server counts as failed")
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
	if cfg.XDSConnectTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--xds-connect-timeout: %s is not positive", cfg.XDSConnectTimeout))
	}
	return errors.Join(errs...)
}

// validateServer checks what connecting to the servers needs.
func (cfg Config) validateServer() (errs []error) {
	if _, err := cfg.servers(); err != nil {
		errs = append(errs, err)
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

// FeatureIgnoreResourceDeletion is gRFC A53's server feature: a resource
// the server deletes is kept in use, and shown as deletion-ignored.
const FeatureIgnoreResourceDeletion = "ignore_resource_deletion"

// serverConfig is one management server of the list.
type serverConfig struct {
	address string
	// name is the name its certificate must carry.
	name string
	// ignoreResourceDeletion is gRFC A53's feature.
	ignoreResourceDeletion bool
}

// servers parses --xds-server-address and --xds-server-name into the
// servers in order of priority. Errors name the flag and the server.
func (cfg Config) servers() ([]serverConfig, error) {
	if strings.TrimSpace(cfg.XDSServerAddress) == "" {
		return nil, errors.New("--xds-server-address: must be set when --enable-xds-control-plane is true")
	}
	addrs := splitList(cfg.XDSServerAddress)
	var errs []error
	seen := map[string]int{}
	servers := make([]serverConfig, len(addrs))
	for i, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		switch {
		case a == "":
			errs = append(errs, fmt.Errorf("--xds-server-address: server %d of %q is empty", i+1, cfg.XDSServerAddress))
		case err != nil:
			errs = append(errs, fmt.Errorf("--xds-server-address: %q is not host:port: %w", a, err))
		case seen[a] > 0:
			errs = append(errs, fmt.Errorf("--xds-server-address: %q is listed twice (servers %d and %d)", a, seen[a], i+1))
		}
		seen[a] = i + 1
		servers[i] = serverConfig{address: a, name: host}
	}
	if names := splitList(cfg.XDSServerName); strings.TrimSpace(cfg.XDSServerName) != "" {
		switch len(names) {
		case 1:
			for i := range servers {
				servers[i].name = names[0]
			}
		case len(servers):
			for i, n := range names {
				if n != "" {
					servers[i].name = n
				}
			}
		default:
			errs = append(errs, fmt.Errorf("--xds-server-name: %d names for %d servers in --xds-server-address: "+
				"give one name for every server, or one per server in the same order", len(names), len(servers)))
		}
	}
	if strings.TrimSpace(cfg.XDSServerFeatures) != "" {
		lists := splitList(cfg.XDSServerFeatures)
		switch len(lists) {
		case 1, len(servers):
			for i := range servers {
				list := lists[0]
				if len(lists) > 1 {
					list = lists[i]
				}
				if err := servers[i].setFeatures(list); err != nil {
					errs = append(errs, err)
				}
			}
		default:
			errs = append(errs, fmt.Errorf("--xds-server-features: %d lists for %d servers in --xds-server-address: "+
				"give one list for every server, or one per server in the same order", len(lists), len(servers)))
		}
	}
	return servers, errors.Join(errs...)
}

// setFeatures takes in one server's features, joined by "+".
func (s *serverConfig) setFeatures(list string) error {
	for f := range strings.SplitSeq(list, "+") {
		switch f = strings.TrimSpace(f); f {
		case "":
		case FeatureIgnoreResourceDeletion:
			s.ignoreResourceDeletion = true
		default:
			return fmt.Errorf("--xds-server-features: %q of server %s is not a known feature (%s)", f, s.address, FeatureIgnoreResourceDeletion)
		}
	}
	return nil
}

// splitList splits a comma-separated flag value, trimming spaces.
func splitList(s string) []string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
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
