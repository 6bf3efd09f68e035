// SPDX-License-Identifier: Apache-2.0

package test

import (
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The capabilities the agent may have, and the ones it cannot work without
// (see the comment in templates/daemonset.yaml).
// SYS_ADMIN only with legacyCapabilities, which TestLegacyCapabilities checks.
var (
	allowedCaps  = []corev1.Capability{"NET_ADMIN", "BPF", "PERFMON", "SYS_ADMIN"}
	requiredCaps = []corev1.Capability{"NET_ADMIN", "BPF"}
)

func TestChartKubeVersion(t *testing.T) {
	chrt := loadChart(t)
	if err := chrt.Validate(); err != nil {
		t.Fatal(err)
	}
	if chrt.Metadata.APIVersion != "v2" || chrt.Metadata.Version != "0.1.0" || chrt.Metadata.AppVersion == "" {
		t.Errorf("Chart.yaml: apiVersion %q version %q appVersion %q", chrt.Metadata.APIVersion, chrt.Metadata.Version, chrt.Metadata.AppVersion)
	}
	if !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, kubeVersion) {
		t.Errorf("kubeVersion %q rejects %s, the version this test renders for", chrt.Metadata.KubeVersion, kubeVersion)
	}
}

func TestDefaultValues(t *testing.T) {
	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kindsOf(r), []string{"ConfigMap/l4xds-config", "DaemonSet/l4xds", "ServiceAccount/l4xds"}; !slices.Equal(got, want) {
		t.Errorf("objects %v, want %v (no control plane unless controlPlane.enabled)", got, want)
	}
	cm := checkAgent(t, r)
	want := map[string]string{
		"enable-xds-control-plane": "false",
		"datapath":                 "bpf",
		"bpf-root":                 "/sys/fs/bpf",
		"lb-maglev-table-size":     "1021",
		"lb-service-map-max":       "4096",
		"lb-backend-map-max":       "1048576",
		"lb-conntrack-max":         "1048576",
		"lb-conntrack-new-max":     "262144",
		"lb-affinity-max":          "65536",
		"api-socket":               "/var/run/l4xds/agent.sock",
		// The uplink and the CNI bridge, detected by the agent: with eth0
		// alone, pod backends' replies came up cni0 unseen and were
		// masqueraded instead of reverse-NATed.
		"devices": "auto",
	}
	if !maps.Equal(cm.Data, want) {
		t.Errorf("ConfigMap data\n got %v\nwant %v", cm.Data, want)
	}
	ds := only[*appsv1.DaemonSet](t, r)
	if tol := ds.Spec.Template.Spec.Tolerations; len(tol) != 1 || tol[0].Operator != corev1.TolerationOpExists || tol[0].Key != "" {
		t.Errorf("tolerations %+v, want one that tolerates every taint", tol)
	}
	if pc := ds.Spec.Template.Spec.PriorityClassName; pc != "system-node-critical" {
		t.Errorf("priorityClassName %q", pc)
	}
	// Cilium's SELinux type for its agent: container_t may not use bpf(2)
	// nor write on the bpffs.
	if sc := ds.Spec.Template.Spec.Containers[0].SecurityContext; sc.SELinuxOptions == nil || sc.SELinuxOptions.Type != "spc_t" || sc.SELinuxOptions.Level != "s0" {
		t.Errorf("seLinuxOptions %+v, want type spc_t, level s0", sc.SELinuxOptions)
	}
	if len(ds.Spec.Template.Spec.Containers[0].Ports) != 0 {
		t.Errorf("metrics off by default, yet the agent has ports %v", ds.Spec.Template.Spec.Containers[0].Ports)
	}
	if !strings.Contains(r.Notes, "xDS client is disabled") {
		t.Errorf("NOTES.txt does not say the xDS client is disabled:\n%s", r.Notes)
	}
}

// helm install --wait counts the DaemonSet ready once NumberReady >=
// DesiredNumberScheduled - maxUnavailable (scaled, rounded up): the default
// must leave at least one agent to wait for on every cluster of two or more
// nodes. maxUnavailable 2 let it return with no agent Ready on two nodes.
func TestUpdateStrategyLetsHelmWait(t *testing.T) {
	r, err := render(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	ds := only[*appsv1.DaemonSet](t, r)
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil || ru.MaxUnavailable == nil {
		t.Fatalf("updateStrategy %+v", ds.Spec.UpdateStrategy)
	}
	for nodes := 2; nodes <= 100; nodes++ {
		unavailable, err := intstr.GetScaledValueFromIntOrPercent(ru.MaxUnavailable, nodes, true)
		if err != nil {
			t.Fatal(err)
		}
		if unavailable != 1 {
			t.Fatalf("maxUnavailable %s is %d of %d nodes: helm --wait would wait for %d Ready agents only", ru.MaxUnavailable.String(), unavailable, nodes, nodes-unavailable)
		}
	}
}

// legacyCapabilities adds SYS_ADMIN, which stands in for BPF and PERFMON on
// runtimes that cannot grant them (a kind node on Docker 20.10 gave the
// agent NET_ADMIN alone); without it the agent has no SYS_ADMIN.
func TestLegacyCapabilities(t *testing.T) {
	for _, tc := range []struct {
		vals map[string]any
		want []corev1.Capability
	}{
		{nil, []corev1.Capability{"NET_ADMIN", "BPF", "PERFMON"}},
		{map[string]any{"legacyCapabilities": true}, []corev1.Capability{"NET_ADMIN", "BPF", "PERFMON", "SYS_ADMIN"}},
		{map[string]any{"legacyCapabilities": true, "capabilities": []any{"NET_ADMIN", "SYS_ADMIN"}}, []corev1.Capability{"NET_ADMIN", "SYS_ADMIN"}},
	} {
		r, err := render(t, tc.vals)
		if err != nil {
			t.Fatal(err)
		}
		checkAgent(t, r)
		sc := only[*appsv1.DaemonSet](t, r).Spec.Template.Spec.Containers[0].SecurityContext
		if !slices.Equal(sc.Capabilities.Add, tc.want) {
			t.Errorf("values %v: capabilities %v, want %v", tc.vals, sc.Capabilities.Add, tc.want)
		}
	}
}

func TestFullValues(t *testing.T) {
	vals := readValues(t, "testdata/full-values.yaml")
	r, err := render(t, vals)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ConfigMap/l4xds-config", "ConfigMap/l4xds-control-plane-resources", "ConfigMap/l4xds-dashboard", "DaemonSet/l4xds",
		"Deployment/l4xds-control-plane", "PodDisruptionBudget/l4xds-control-plane", "PrometheusRule/l4xds",
		"Service/l4xds-agent-metrics", "Service/l4xds-control-plane", "Service/l4xds-cp-metrics", "ServiceAccount/l4xds",
		"ServiceMonitor/l4xds-agent", "ServiceMonitor/l4xds-control-plane",
	}
	if got := kindsOf(r); !slices.Equal(got, want) {
		t.Errorf("objects %v, want %v", got, want)
	}
	cm := checkAgent(t, r)
	// Each value lands in the key of its flag. The server address is the
	// chart's own control plane Service, as serverAddress is left empty.
	wantData := map[string]string{
		"enable-xds-control-plane":            "true",
		"xds-server-address":                  "l4xds-control-plane.kube-system.svc:9000",
		"xds-server-name":                     "l4xds-control-plane.kube-system.svc",
		"xds-client-cert-path":                "/var/lib/l4xds/tls/tls.crt",
		"xds-client-key-path":                 "/var/lib/l4xds/tls/tls.key",
		"xds-ca-cert-path":                    "/var/lib/l4xds/tls/ca.crt",
		"xds-protocol":                        "delta",
		"xds-node-id":                         "lb-1",
		"xds-node-cluster":                    "edge",
		"xds-node-region":                     "eu-west",
		"xds-node-zone":                       "eu-west-1a",
		"xds-node-sub-zone":                   "rack-7",
		"xds-max-recv-msg-size":               "134217728",
		"xds-resource-does-not-exist-timeout": "30s",
		"datapath":                            "bpf",
		"devices":                             "eth0,eth1",
		"bpf-root":                            "/run/l4xds/bpffs",
		"lb-maglev-table-size":                "16381",
		"lb-service-map-max":                  "20000",
		"lb-backend-map-max":                  "2000000",
		"lb-conntrack-max":                    "4194304",
		"lb-conntrack-new-max":                "1048576",
		"lb-affinity-max":                     "131072",
		"api-socket":                          "/run/l4xds/api/agent.sock",
		"prometheus-serve-addr":               ":9971",
		"datapath-service-metrics":            "false",
	}
	if !maps.Equal(cm.Data, wantData) {
		t.Errorf("ConfigMap data\n got %v\nwant %v", cm.Data, wantData)
	}

	ds := only[*appsv1.DaemonSet](t, r)
	pod := ds.Spec.Template.Spec
	agent := pod.Containers[0]
	if agent.Image != "registry.example.com/l4xds:v9" || agent.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %q %q", agent.Image, agent.ImagePullPolicy)
	}
	if !slices.Contains(agent.Args, "--debug") || !slices.Contains(agent.Args, "--xds-node-zone=overridden") {
		t.Errorf("args %q lack --debug or the extraArgs", agent.Args)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].ContainerPort != 9971 || agent.Ports[0].HostPort != 9971 {
		t.Errorf("metrics port %+v, want 9971 on the host", agent.Ports)
	}
	if ann := ds.Spec.Template.Annotations; ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "9971" || ann["example.com/team"] != "lb" {
		t.Errorf("pod annotations %v", ann)
	}
	if ds.Spec.Template.Labels["example.com/tier"] != "edge" {
		t.Errorf("pod labels %v lack podLabels", ds.Spec.Template.Labels)
	}
	// The agent reads the client certificate and key and the CA from the
	// mounted Secret: each path is a key of the Secret in its mount.
	mount := volumeMount(t, agent, "xds-tls")
	if v := volume(t, pod, "xds-tls"); v.Secret == nil || v.Secret.SecretName != "l4xds-agent-tls" {
		t.Errorf("xds-tls volume %+v, want Secret l4xds-agent-tls", v)
	}
	for _, key := range []string{"xds-client-cert-path", "xds-client-key-path", "xds-ca-cert-path"} {
		p := cm.Data[key]
		if filepath.Dir(p) != mount.MountPath || !slices.Contains([]string{"tls.crt", "tls.key", "ca.crt"}, filepath.Base(p)) {
			t.Errorf("%s %q is not a key of the Secret mounted at %s", key, p, mount.MountPath)
		}
	}
	if !mount.ReadOnly {
		t.Error("the TLS Secret is mounted writable")
	}
	if pod.PriorityClassName != "" || len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "example.com/lb" {
		t.Errorf("priorityClassName %q tolerations %+v: the values were not applied", pod.PriorityClassName, pod.Tolerations)
	}
	if ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.String() != "10%" {
		t.Errorf("updateStrategy %+v", ds.Spec.UpdateStrategy)
	}
	if pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault ||
		pod.SecurityContext.FSGroup == nil {
		t.Errorf("podSecurityContext %+v not applied", pod.SecurityContext)
	}
	if se := agent.SecurityContext.SELinuxOptions; se == nil || se.Type != "l4xds_t" || se.Level != "s0:c1" {
		t.Errorf("seLinuxOptions %+v not applied", se)
	}
	if !strings.Contains(r.Notes, "l4xds-control-plane.kube-system.svc:9000") || !strings.Contains(r.Notes, "--socket /run/l4xds/api/agent.sock") {
		t.Errorf("NOTES.txt does not name the server or the API socket:\n%s", r.Notes)
	}

	checkControlPlane(t, r, vals)
}

// checkAgent checks what every rendering of the agent must hold, and
// returns its ConfigMap.
func checkAgent(t *testing.T, r *rendered) *corev1.ConfigMap {
	t.Helper()
	checkNames(t, r)
	ds := only[*appsv1.DaemonSet](t, r)
	pod := ds.Spec.Template.Spec
	checkSelector(t, "DaemonSet", ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)
	checkMounts(t, pod)

	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v dnsPolicy %q: the datapath needs the node's interfaces and cluster DNS", pod.HostNetwork, pod.DNSPolicy)
	}
	sa := only[*corev1.ServiceAccount](t, r)
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, the chart's ServiceAccount is %q", pod.ServiceAccountName, sa.Name)
	}
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken || pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the agent needs no API token, yet one would be mounted")
	}
	if ds.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no checksum/config annotation: a changed ConfigMap would not roll the agents")
	}

	if len(pod.Containers) != 1 || len(pod.InitContainers) != 0 {
		t.Fatalf("want the agent container alone, got %d containers and %d init containers", len(pod.Containers), len(pod.InitContainers))
	}
	agent := pod.Containers[0]
	if len(agent.Command) != 1 || agent.Command[0] != "l4xds-agent" {
		t.Errorf("command %q", agent.Command)
	}
	// Every flag on the command line must be one of the agent's.
	agentFlags := helpFlags(t, "l4xds-agent")
	for _, a := range agent.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, ok := agentFlags[name]; !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("arg %q is not a flag of l4xds-agent", a)
		}
	}

	sc := agent.SecurityContext
	// The runtime's default seccomp profile, which allows bpf(2) to a
	// container with CAP_BPF or CAP_SYS_ADMIN (containerd 1.6.9 and 1.7).
	if (pod.SecurityContext == nil || pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) &&
		(sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
		t.Errorf("no RuntimeDefault seccomp profile: pod %+v, container %+v", pod.SecurityContext, sc)
	}
	switch {
	case sc == nil || sc.Privileged == nil || *sc.Privileged:
		t.Error("the agent must say privileged: false")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Error("allowPrivilegeEscalation must be false")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Error("readOnlyRootFilesystem must be true")
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
		t.Errorf("capabilities %+v must drop ALL", sc.Capabilities)
	default:
		for _, c := range sc.Capabilities.Add {
			if !slices.Contains(allowedCaps, c) {
				t.Errorf("capability %s is not one the agent needs (%v)", c, allowedCaps)
			}
		}
		for _, c := range requiredCaps {
			// SYS_ADMIN covers BPF, as the agent's own check accepts.
			if !slices.Contains(sc.Capabilities.Add, c) && (c != "BPF" || !slices.Contains(sc.Capabilities.Add, "SYS_ADMIN")) {
				t.Errorf("capability %s is missing: the datapath cannot load without it", c)
			}
		}
	}

	cm := configMapOf(t, r, pod, agent, "config")
	if !slices.Contains(agent.Args, "--config-dir="+volumeMount(t, agent, "config").MountPath) {
		t.Errorf("args %q do not read the ConfigMap mounted at %s", agent.Args, volumeMount(t, agent, "config").MountPath)
	}
	checkAgentConfig(t, cm.Data)

	// Of the node's bpffs, the agent's own directory alone, where the
	// agent pins (<bpf-root>/l4xds), on a tmpfs at --bpf-root that holds
	// nothing else: the pins of other programs on the node (Cilium's,
	// say) are not in the container.
	root, own := cm.Data["bpf-root"], filepath.Join(cm.Data["bpf-root"], "l4xds")
	bpf := volumeMount(t, agent, "bpf-maps")
	if v := volume(t, pod, "bpf-maps"); v.HostPath == nil || v.HostPath.Path != own || bpf.MountPath != own {
		t.Errorf("bpffs volume %+v mounted at %s, want the node's %s", v.VolumeSource, bpf.MountPath, own)
	}
	if bpf.MountPropagation != nil && *bpf.MountPropagation != corev1.MountPropagationNone {
		t.Errorf("bpffs mount propagation %s, want none: the agent's directory holds what the agent pins, nothing mounted", *bpf.MountPropagation)
	}
	rootMount := volumeMount(t, agent, "bpf-root")
	if v := volume(t, pod, "bpf-root"); v.EmptyDir == nil || v.EmptyDir.Medium != corev1.StorageMediumMemory || rootMount.MountPath != root {
		t.Errorf("bpf-root volume %+v mounted at %s, want a tmpfs at %s", v.VolumeSource, rootMount.MountPath, root)
	}
	for _, v := range pod.Volumes {
		if v.HostPath != nil && (v.HostPath.Path == root || strings.HasPrefix(root, v.HostPath.Path+"/")) {
			t.Errorf("volume %s mounts the node's %s: all of its bpffs", v.Name, v.HostPath.Path)
		}
	}
	// The API socket's directory on the node.
	socket := cm.Data["api-socket"]
	run := volumeMount(t, agent, "run")
	if v := volume(t, pod, "run"); v.HostPath == nil || v.HostPath.Path != filepath.Dir(socket) || run.MountPath != filepath.Dir(socket) {
		t.Errorf("run volume %+v at %s, want the node's %s", v.VolumeSource, run.MountPath, filepath.Dir(socket))
	}

	// NODE_NAME is the agent's default xDS node id.
	var nodeName bool
	for _, e := range agent.Env {
		nodeName = nodeName || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}
	if !nodeName {
		t.Error("no NODE_NAME from spec.nodeName: the node id would be the host name")
	}

	// Readiness follows the agent's readiness (its first state served),
	// not its health: a dead xDS server would make every agent NotReady at
	// once. Liveness follows neither, or it would restart them all.
	ready, live := agent.ReadinessProbe, agent.LivenessProbe
	if ready == nil || ready.Exec == nil || !slices.Equal(ready.Exec.Command, []string{"l4xds-dbg", "--socket", socket, "status", "--readiness"}) {
		t.Errorf("readinessProbe %+v, want l4xds-dbg --socket %s status --readiness", ready, socket)
	} else {
		checkCommand(t, ready.Exec.Command)
	}
	if live == nil || live.Exec == nil || slices.Contains(live.Exec.Command, "status") || !slices.Contains(live.Exec.Command, socket) {
		t.Errorf("livenessProbe %+v: want a command that asks the agent on %s but ignores its health", live, socket)
	} else {
		checkCommand(t, live.Exec.Command)
	}
	return cm
}

// xdsService is the control plane's xDS Service (the only one with an xds
// port; the metrics Service has none).
func xdsService(t *testing.T, r *rendered) *corev1.Service {
	t.Helper()
	var out []*corev1.Service
	for _, svc := range find[*corev1.Service](r) {
		if slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "xds" }) {
			out = append(out, svc)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d Services with an xds port, want one", len(out))
	}
	return out[0]
}

func checkControlPlane(t *testing.T, r *rendered, vals map[string]any) {
	t.Helper()
	dep := only[*appsv1.Deployment](t, r)
	svc := xdsService(t, r)
	pod := dep.Spec.Template.Spec
	checkSelector(t, "Deployment", dep.Spec.Selector.MatchLabels, dep.Spec.Template.Labels)
	checkMounts(t, pod)
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
		t.Errorf("Service selector %v does not select the control plane pods %v", svc.Spec.Selector, dep.Spec.Template.Labels)
	}
	ds := only[*appsv1.DaemonSet](t, r)
	if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Error("the control plane Service selects the agents too")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	if svc.Spec.Ports[0].TargetPort != intstr.FromString("xds") || len(c.Ports) != 2 || c.Ports[0].Name != "xds" || c.Ports[1].Name != "health" {
		t.Errorf("Service targetPort %v, container ports %+v", svc.Spec.Ports[0].TargetPort, c.Ports)
	}
	// Ready once it serves a complete state, which only /readyz knows.
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port != intstr.FromString("health") {
		t.Errorf("readinessProbe %+v, want GET /readyz on the health port", p)
	}
	if c.Image != "registry.example.com/l4xds-control-plane:v9" {
		t.Errorf("control plane image %q", c.Image)
	}
	if sc := pod.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the control plane needs no root and must not run as root")
	}
	if *dep.Spec.Replicas != 2 {
		t.Errorf("replicas %d", *dep.Spec.Replicas)
	}

	// Its command line: l4xds-control-plane serve with real flags, files
	// that are in its mounts.
	args := map[string]string{}
	for _, a := range serveArgs(t, c) {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		args[name] = value
	}
	cm := configMapOf(t, r, pod, c, "resources")
	if mount := volumeMount(t, c, "resources"); args["resources"] != filepath.Join(mount.MountPath, "resources.yaml") || mount.SubPath != "" {
		t.Errorf("--resources %q, resources ConfigMap at %s (subPath %q): the file must be in the mounted directory, not a subPath", args["resources"], mount.MountPath, mount.SubPath)
	}
	cp := vals["controlPlane"].(map[string]any)
	if cm.Data["resources.yaml"] != cp["xdsResources"] {
		t.Errorf("resources.yaml %q is not controlPlane.xdsResources %q", cm.Data["resources.yaml"], cp["xdsResources"])
	}
	tls := volumeMount(t, c, "tls")
	if v := volume(t, pod, "tls"); v.Secret == nil || v.Secret.SecretName != cp["tlsSecretName"] {
		t.Errorf("tls volume %+v, want Secret %v", v.VolumeSource, cp["tlsSecretName"])
	}
	for flag, key := range map[string]string{"cert": "tls.crt", "key": "tls.key", "client-ca": "ca.crt"} {
		if args[flag] != filepath.Join(tls.MountPath, key) {
			t.Errorf("--%s %q, want %s of the mounted Secret", flag, args[flag], key)
		}
	}
	if _, ok := args["insecure"]; ok {
		t.Error("--insecure with a TLS Secret")
	}
	if want := fmt.Sprintf(":%d", c.Ports[len(c.Ports)-1].ContainerPort); args["health-listen"] != want {
		t.Errorf("--health-listen %q, the health port is %s", args["health-listen"], want)
	}

	// The agents dial the Service.
	addr := fmt.Sprintf("%s.%s.svc:%d", svc.Name, namespace, svc.Spec.Ports[0].Port)
	for _, m := range find[*corev1.ConfigMap](r) {
		if v, ok := m.Data["xds-server-address"]; ok && v != addr {
			t.Errorf("xds-server-address %q, the control plane Service is %s", v, addr)
		}
	}
}

// serveArgs checks that c runs l4xds-control-plane serve with flags it has,
// and returns them.
func serveArgs(t *testing.T, c corev1.Container) []string {
	t.Helper()
	if !slices.Equal(c.Command, []string{"l4xds-control-plane"}) || len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("command %q args %q", c.Command, c.Args)
	}
	serveFlags := helpFlags(t, "l4xds-control-plane", "serve")
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if _, ok := serveFlags[name]; !ok {
			t.Errorf("arg %q is not a flag of l4xds-control-plane serve", a)
		}
	}
	return c.Args[1:]
}

// The rights of the control plane serving the cluster: exactly the calls
// of cmd/l4xds-control-plane/kubesource (informers, status updates, Events).
var kubeSourceRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"services/status"}, Verbs: []string{"update"}},
	{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gatewayclasses", "gateways", "tcproutes", "udproutes"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"gateway.networking.k8s.io"}, Resources: []string{"gatewayclasses/status", "gateways/status", "tcproutes/status", "udproutes/status"}, Verbs: []string{"update"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
}

// checkBinding checks that a binding grants the role to the control
// plane's ServiceAccount.
func checkBinding(t *testing.T, kind string, ref rbacv1.RoleRef, subjects []rbacv1.Subject, role string) {
	t.Helper()
	want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "l4xds-control-plane", Namespace: namespace}}
	if ref != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: kind, Name: role}) || !slices.Equal(subjects, want) {
		t.Errorf("%s binding: roleRef %+v subjects %+v, want %s %s to %+v", kind, ref, subjects, kind, role, want)
	}
}

func TestControlPlaneVariants(t *testing.T) {
	for name, c := range map[string]struct {
		values string
		check  func(t *testing.T, r *rendered)
	}{
		"JSON logs": {
			values: `
logFormat: json
xdsControlPlane: {enabled: true, insecure: true}
controlPlane: {enabled: true, insecure: true, existingConfigMap: my-resources, logFormat: json}`,
			check: func(t *testing.T, r *rendered) {
				cp := only[*appsv1.Deployment](t, r).Spec.Template.Spec.Containers[0]
				agent := only[*appsv1.DaemonSet](t, r).Spec.Template.Spec.Containers[0]
				if !slices.Contains(cp.Args, "--log-format=json") || !slices.Contains(agent.Args, "--log-format=json") {
					t.Errorf("control plane args %q, agent args %q: want --log-format=json in both", cp.Args, agent.Args)
				}
			},
		},
		"existing ConfigMap, plaintext": {
			values: `
xdsControlPlane: {enabled: true, insecure: true}
controlPlane: {enabled: true, insecure: true, existingConfigMap: my-resources}`,
			check: func(t *testing.T, r *rendered) {
				if got := kindsOf(r); slices.Contains(got, "ConfigMap/l4xds-control-plane-resources") {
					t.Errorf("objects %v: a resources ConfigMap beside existingConfigMap", got)
				}
				pod := only[*appsv1.Deployment](t, r).Spec.Template.Spec
				if v := volume(t, pod, "resources"); v.ConfigMap == nil || v.ConfigMap.Name != "my-resources" {
					t.Errorf("resources volume %+v", v.VolumeSource)
				}
				if !slices.Contains(pod.Containers[0].Args, "--insecure") || len(pod.Volumes) != 1 {
					t.Errorf("args %q volumes %d: want --insecure and no TLS volume", pod.Containers[0].Args, len(pod.Volumes))
				}
				cm := checkAgent(t, r)
				if cm.Data["xds-insecure"] != "true" || cm.Data["xds-client-cert-path"] != "" {
					t.Errorf("agent ConfigMap %v: want xds-insecure and no certificate paths", cm.Data)
				}
				if len(volumes(only[*appsv1.DaemonSet](t, r).Spec.Template.Spec, "xds-tls")) != 0 {
					t.Error("a TLS volume on a plaintext agent")
				}
			},
		},
		"serving the cluster, no resources file": {
			values: `
xdsControlPlane: {enabled: true, insecure: true}
controlPlane:
  enabled: true
  insecure: true
  kubernetes:
    enabled: true
    backendMode: node-port
    addressPools: ["lan=192.0.2.10-192.0.2.50,192.0.2.60/30", "v6=2001:db8:1::/120"]
    addressPoolsConfigMap: l4xds-pools`,
			check: func(t *testing.T, r *rendered) {
				want := []string{
					"ClusterRole/l4xds-control-plane", "ClusterRoleBinding/l4xds-control-plane", "ConfigMap/l4xds-config",
					"DaemonSet/l4xds", "Deployment/l4xds-control-plane", "PodDisruptionBudget/l4xds-control-plane",
					"Role/l4xds-control-plane-leader", "Role/l4xds-control-plane-pools",
					"RoleBinding/l4xds-control-plane-leader", "RoleBinding/l4xds-control-plane-pools", "Service/l4xds-control-plane",
					"ServiceAccount/l4xds", "ServiceAccount/l4xds-control-plane",
				}
				if got := kindsOf(r); !slices.Equal(got, want) {
					t.Errorf("objects %v, want %v", got, want)
				}
				checkNames(t, r)
				pod := only[*appsv1.Deployment](t, r).Spec.Template.Spec
				if pod.ServiceAccountName != "l4xds-control-plane" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
					t.Errorf("serviceAccountName %q automount %v: --in-cluster needs the control plane's token", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
				}
				if len(pod.Volumes) != 0 {
					t.Errorf("volumes %+v: no resources file, no TLS", pod.Volumes)
				}
				wantArgs := []string{
					"--in-cluster", "--load-balancer-class=l4xds.io/l4lb", "--gateway-controller-name=l4xds.io/gateway-controller",
					"--backend-mode=node-port", "--address-pool=lan=192.0.2.10-192.0.2.50,192.0.2.60/30", "--address-pool=v6=2001:db8:1::/120",
					"--address-pools-configmap=kube-system/l4xds-pools", "--leader-elect", "--leader-elect-lease=kube-system/l4xds-control-plane", "--max-connection-age=30m",
					"--listen=:9000", "--health-listen=:9001", "--log-level=info", "--insecure",
				}
				if args := serveArgs(t, pod.Containers[0]); !slices.Equal(args, wantArgs) {
					t.Errorf("args\n got %q\nwant %q", args, wantArgs)
				}
				cr := only[*rbacv1.ClusterRole](t, r)
				if !reflect.DeepEqual(cr.Rules, kubeSourceRules) {
					t.Errorf("ClusterRole rules\n got %+v\nwant %+v", cr.Rules, kubeSourceRules)
				}
				crb := only[*rbacv1.ClusterRoleBinding](t, r)
				checkBinding(t, "ClusterRole", crb.RoleRef, crb.Subjects, cr.Name)
				roles, bindings := find[*rbacv1.Role](r), find[*rbacv1.RoleBinding](r)
				wantRules := map[string][]rbacv1.PolicyRule{
					"l4xds-control-plane-leader": {{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}}},
					"l4xds-control-plane-pools":  {{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}}},
				}
				if len(roles) != len(wantRules) || len(bindings) != len(roles) {
					t.Fatalf("%d Roles and %d RoleBindings, want %d of each", len(roles), len(bindings), len(wantRules))
				}
				for i, role := range roles {
					if role.Namespace != namespace || !reflect.DeepEqual(role.Rules, wantRules[role.Name]) {
						t.Errorf("Role %s in %q rules %+v, want %+v in %s", role.Name, role.Namespace, role.Rules, wantRules[role.Name], namespace)
					}
					checkBinding(t, "Role", bindings[i].RoleRef, bindings[i].Subjects, role.Name)
				}
				// Two replicas, one writer: the Lease's namespace and the
				// replica's name come from the pod.
				d := only[*appsv1.Deployment](t, r)
				if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
					t.Errorf("replicas %v, want 2 serving the cluster", d.Spec.Replicas)
				}
				env := map[string]string{}
				for _, e := range pod.Containers[0].Env {
					if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
						env[e.Name] = e.ValueFrom.FieldRef.FieldPath
					}
				}
				if env["POD_NAMESPACE"] != "metadata.namespace" || env["POD_NAME"] != "metadata.name" {
					t.Errorf("env %v: --leader-elect needs POD_NAMESPACE and POD_NAME", env)
				}
				if a := pod.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
					t.Errorf("affinity %+v: want the replicas spread over nodes", a)
				}
				pdb := only[*policyv1.PodDisruptionBudget](t, r)
				checkSelector(t, "PodDisruptionBudget", pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
				if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
					t.Errorf("PodDisruptionBudget maxUnavailable %v, want 1", pdb.Spec.MaxUnavailable)
				}
			},
		},
		"serving the cluster and a resources file": {
			values: `
xdsControlPlane: {enabled: true, tlsSecretName: xds-client}
controlPlane:
  enabled: true
  tlsSecretName: cp-tls
  xdsResources: "resources: []"
  kubernetes: {enabled: true, addressPools: ["lan=192.0.2.10-192.0.2.50"]}`,
			check: func(t *testing.T, r *rendered) {
				got := kindsOf(r)
				if !slices.Contains(got, "ConfigMap/l4xds-control-plane-resources") || slices.Contains(got, "Role/l4xds-control-plane-pools") {
					t.Errorf("objects %v: want the resources ConfigMap, and no Role without a pools ConfigMap", got)
				}
				pod := only[*appsv1.Deployment](t, r).Spec.Template.Spec
				checkMounts(t, pod)
				args := serveArgs(t, pod.Containers[0])
				if !slices.Contains(args, "--in-cluster") || !slices.Contains(args, "--resources=/etc/l4xds/resources/resources.yaml") {
					t.Errorf("args %q: want both sources", args)
				}
				if cm := configMapOf(t, r, pod, pod.Containers[0], "resources"); cm.Data["resources.yaml"] != "resources: []" {
					t.Errorf("resources.yaml %q", cm.Data["resources.yaml"])
				}
			},
		},
		"external server, datapath none": {
			values: `
xdsControlPlane: {enabled: true, serverAddress: "xds.example.internal:9000", tlsSecretName: xds-client}
datapath: none
serviceAccount: {create: false, name: lb-agent}`,
			check: func(t *testing.T, r *rendered) {
				if got := kindsOf(r); !slices.Equal(got, []string{"ConfigMap/l4xds-config", "DaemonSet/l4xds"}) {
					t.Errorf("objects %v", got)
				}
				ds := only[*appsv1.DaemonSet](t, r)
				if sa := ds.Spec.Template.Spec.ServiceAccountName; sa != "lb-agent" {
					t.Errorf("serviceAccountName %q", sa)
				}
				checkNames(t, r)
				cm := only[*corev1.ConfigMap](t, r)
				checkAgentConfig(t, cm.Data)
				if cm.Data["xds-server-address"] != "xds.example.internal:9000" || cm.Data["datapath"] != "none" {
					t.Errorf("ConfigMap %v", cm.Data)
				}
			},
		},
		"two external servers in order of priority, one name each (gRFC A71)": {
			values: `
xdsControlPlane:
  enabled: true
  serverAddress: [xds-a.example.internal:9000, "[fd00::2]:9000"]
  serverName: [xds-a.example.internal, xds-b.example.internal]
  tlsSecretName: xds-client`,
			check: func(t *testing.T, r *rendered) {
				cm := only[*corev1.ConfigMap](t, r)
				checkAgentConfig(t, cm.Data)
				if cm.Data["xds-server-address"] != "xds-a.example.internal:9000,[fd00::2]:9000" ||
					cm.Data["xds-server-name"] != "xds-a.example.internal,xds-b.example.internal" {
					t.Errorf("ConfigMap %v: want both servers and both names, comma-separated, in order", cm.Data)
				}
			},
		},
		"two external servers comma-separated, one name for both": {
			values: `
xdsControlPlane: {enabled: true, serverAddress: "10.0.0.1:9000,10.0.0.2:9000", serverName: xds.example.internal, tlsSecretName: xds-client}`,
			check: func(t *testing.T, r *rendered) {
				cm := only[*corev1.ConfigMap](t, r)
				checkAgentConfig(t, cm.Data)
				if cm.Data["xds-server-address"] != "10.0.0.1:9000,10.0.0.2:9000" || cm.Data["xds-server-name"] != "xds.example.internal" {
					t.Errorf("ConfigMap %v", cm.Data)
				}
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			vals, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			r, err := render(t, vals)
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, r)
		})
	}
}

// A typo or a wrong type in the values fails `helm install` and names the
// key, instead of being ignored.
func TestSchemaRejects(t *testing.T) {
	for _, c := range []struct{ values, want string }{
		{"xdsControlPlane: {serverAdress: x}", "serverAdress"},
		{"devics: [eth0]", "devics"},
		{"controlPlane: {service: {prot: 9000}}", "prot"},
		{"prometheus: {enabled: true, port: 99999}", "/prometheus/port"},
		{"maglevTableSize: big", "/maglevTableSize"},
		{"xdsControlPlane: {protocol: grpc}", "/xdsControlPlane/protocol"},
		{"xdsControlPlane: {serverAddress: no-port}", "/xdsControlPlane/serverAddress"},
		{"xdsControlPlane: {serverAddress: 'a:9000,no-port'}", "/xdsControlPlane/serverAddress"},
		{"xdsControlPlane: {serverAddress: ['a:9000', no-port]}", "/xdsControlPlane/serverAddress"},
		{"xdsControlPlane: {serverAddress: []}", "/xdsControlPlane/serverAddress"},
		{"xdsControlPlane: {resourceDoesNotExistTimeout: 15}", "/xdsControlPlane/resourceDoesNotExistTimeout"},
		{`devices: ["eth0,eth1"]`, "/devices/0"},
		{"datapath: xdp", "/datapath"},
		{"extraArgs: [debug]", "/extraArgs/0"},
		{"bpfRoot: sys/fs/bpf", "/bpfRoot"},
		{"nodeSelector: {zone: 1}", "/nodeSelector/zone"},
	} {
		t.Run(c.values, func(t *testing.T) {
			vals, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			_, err = render(t, vals)
			if err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want a schema error naming %q", err, c.want)
			}
		})
	}
}

// Settings that cannot work together fail with a message that says which
// value to set. A Secret must be named without tls.auto, or with it but an
// xDS server other than the chart's (helm's CA would be one that server
// does not trust).
func TestTemplateRejects(t *testing.T) {
	for _, c := range []struct{ values, want string }{
		{"xdsControlPlane: {enabled: true, tlsSecretName: s}", "xdsControlPlane.serverAddress: required"},
		{"xdsControlPlane: {enabled: true, serverAddress: 'x:1'}", "xdsControlPlane.tlsSecretName: required"},
		{"xdsControlPlane: {enabled: true, serverAddress: 'x:1'}\ntls: {auto: {method: certmanager}}", "xdsControlPlane.tlsSecretName: required"},
		{"controlPlane: {enabled: true}\ntls: {auto: {enabled: false}}", "controlPlane.tlsSecretName: required"},
		{"xdsControlPlane: {enabled: true}\ncontrolPlane: {enabled: true, xdsResources: 'resource: {}'}\ntls: {auto: {enabled: false}}", "tlsSecretName: required"},
	} {
		t.Run(c.values, func(t *testing.T) {
			vals, err := chartutil.ReadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			_, err = render(t, vals)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

func kindsOf(r *rendered) []string {
	var out []string
	for _, o := range r.Objects {
		out = append(out, o.Kind+"/"+o.Name)
	}
	slices.Sort(out)
	return out
}

// checkNames checks that every object's name is one the API server takes
// and that no two objects of a kind share one.
func checkNames(t *testing.T, r *rendered) {
	t.Helper()
	seen := map[string]bool{}
	for _, o := range r.Objects {
		if errs := validation.IsDNS1123Subdomain(o.Name); len(errs) > 0 {
			t.Errorf("%s %q: %v", o.Kind, o.Name, errs)
		}
		if o.Kind == "Service" {
			if errs := validation.IsDNS1035Label(o.Name); len(errs) > 0 {
				t.Errorf("Service %q: %v", o.Name, errs)
			}
		}
		if seen[o.Kind+"/"+o.Name] {
			t.Errorf("%s %q rendered twice", o.Kind, o.Name)
		}
		seen[o.Kind+"/"+o.Name] = true
	}
}

func checkSelector(t *testing.T, kind string, selector, podLabels map[string]string) {
	t.Helper()
	if len(selector) == 0 || !labels.SelectorFromSet(selector).Matches(labels.Set(podLabels)) {
		t.Errorf("%s selector %v does not select its pods %v", kind, selector, podLabels)
	}
}

// checkMounts checks that every mount names a volume of the pod and every
// volume is mounted.
func checkMounts(t *testing.T, pod corev1.PodSpec) {
	t.Helper()
	mounted := map[string]bool{}
	for _, c := range pod.Containers {
		for _, m := range c.VolumeMounts {
			if len(volumes(pod, m.Name)) != 1 {
				t.Errorf("container %s mounts %q, which is not one volume of the pod", c.Name, m.Name)
			}
			mounted[m.Name] = true
		}
	}
	for _, v := range pod.Volumes {
		if !mounted[v.Name] {
			t.Errorf("volume %q is mounted nowhere", v.Name)
		}
	}
}

func volumes(pod corev1.PodSpec, name string) []corev1.Volume {
	var out []corev1.Volume
	for _, v := range pod.Volumes {
		if v.Name == name {
			out = append(out, v)
		}
	}
	return out
}

func volume(t *testing.T, pod corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	vs := volumes(pod, name)
	if len(vs) != 1 {
		t.Fatalf("want one volume %q, got %d", name, len(vs))
	}
	return vs[0]
}

func volumeMount(t *testing.T, c corev1.Container, name string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("container %s does not mount %q", c.Name, name)
	return corev1.VolumeMount{}
}

// configMapOf returns the rendered ConfigMap that volume is, mounted in c.
func configMapOf(t *testing.T, r *rendered, pod corev1.PodSpec, c corev1.Container, name string) *corev1.ConfigMap {
	t.Helper()
	volumeMount(t, c, name)
	v := volume(t, pod, name)
	if v.ConfigMap == nil {
		t.Fatalf("volume %q is not a ConfigMap: %+v", name, v.VolumeSource)
	}
	for _, cm := range find[*corev1.ConfigMap](r) {
		if cm.Name == v.ConfigMap.Name {
			return cm
		}
	}
	t.Fatalf("volume %q refers to ConfigMap %q, which the chart does not render", name, v.ConfigMap.Name)
	return nil
}
