// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"net"
	"slices"
)

// AutoDevices in --devices stands for the interfaces detected at start.
const AutoDevices = "auto"

// The datapath must see both halves of a flow: the packets to a VIP where
// they enter the node, and the backends' replies where they enter it. On a
// Kubernetes node, the first arrive on the uplink (eth0), and replies of pod
// backends come up from the CNI's interface, e.g. a bridge such as cni0,
// not on the uplink. Both carry the node's addresses, while the pods' veths
// and unused interfaces carry none, so "auto" picks every interface that is
// up, is not a loopback and has a global unicast address.

// resolveDevices replaces "auto" in devices with the detected interfaces.
func resolveDevices(devices []string) ([]string, error) {
	if !slices.Contains(devices, AutoDevices) {
		return devices, nil
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := slices.DeleteFunc(slices.Clone(devices), func(d string) bool { return d == AutoDevices })
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 || slices.Contains(out, iface.Name) {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(addrs, isGlobalUnicast) {
			out = append(out, iface.Name)
		}
	}
	return out, nil
}

func isGlobalUnicast(a net.Addr) bool {
	n, ok := a.(*net.IPNet)
	return ok && n.IP.IsGlobalUnicast()
}
