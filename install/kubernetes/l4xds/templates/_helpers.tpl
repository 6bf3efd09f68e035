{{/* SPDX-License-Identifier: Apache-2.0 */}}

{{/* The chart's name in labels: nameOverride, else l4xds. */}}
{{- define "l4xds.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object's name, <fullname> in Documentation/kubernetes.md:
fullnameOverride; else the release name when it contains the chart's name
(l4xds, or nameOverride); else <release>-<name>.
*/}}
{{- define "l4xds.fullname" -}}
{{- $override := .Values.fullnameOverride -}}
{{- $name := include "l4xds.name" . -}}
{{- if $override -}}
{{- $override | trunc 63 | trimSuffix "-" -}}
{{- else if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "l4xds.controlPlaneName" -}}
{{- printf "%s-control-plane" (include "l4xds.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "l4xds.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "l4xds.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "l4xds.labels" -}}
app.kubernetes.io/name: {{ include "l4xds.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Selector labels: stable across upgrades (a selector is immutable). */}}
{{- define "l4xds.agentSelector" -}}
app.kubernetes.io/name: {{ include "l4xds.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "l4xds.controlPlaneSelector" -}}
app.kubernetes.io/name: {{ include "l4xds.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: control-plane
{{- end -}}

{{/* image: a dict with repository, tag, pullPolicy; an empty tag is the appVersion. */}}
{{- define "l4xds.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "l4xds.controlPlaneImage" -}}
{{- $repo := default .Values.image.repository .Values.controlPlane.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.controlPlane.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/*
The ConfigMap of Envoy resources the control plane serves: existingConfigMap,
else the chart's own; none when it serves the cluster (kubernetes.enabled)
and no xdsResources are given.
*/}}
{{- define "l4xds.controlPlaneResources" -}}
{{- $cp := .Values.controlPlane -}}
{{- if $cp.existingConfigMap -}}
{{- $cp.existingConfigMap -}}
{{- else if or (not ($cp.kubernetes | default dict).enabled) $cp.xdsResources -}}
{{- printf "%s-resources" (include "l4xds.controlPlaneName" .) -}}
{{- end -}}
{{- end -}}

{{/*
The xDS server address of the agents: xdsControlPlane.serverAddress, else the
reference control plane's Service when the chart runs one.
*/}}
{{- define "l4xds.serverAddress" -}}
{{- if .Values.xdsControlPlane.serverAddress -}}
{{- include "l4xds.list" .Values.xdsControlPlane.serverAddress -}}
{{- else if .Values.controlPlane.enabled -}}
{{- printf "%s.%s.svc:%d" (include "l4xds.controlPlaneName" .) .Release.Namespace (int .Values.controlPlane.service.port) -}}
{{- end -}}
{{- end -}}

{{/*
A value that is a list or a comma-separated string, as the agent's flag
takes it: comma-separated.
*/}}
{{- define "l4xds.list" -}}
{{- if kindIs "slice" . -}}
{{- join "," . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* Directory of the agent's API socket, shared with the node. */}}
{{- define "l4xds.runDir" -}}
{{- dir .Values.apiSocket -}}
{{- end -}}

{{/* Where the agent's TLS Secret is mounted: the default cert paths point into it. */}}
{{- define "l4xds.tlsDir" -}}
/var/lib/l4xds/tls
{{- end -}}

{{/* The control plane's replicas: as set, else 2 when it serves the cluster
(every replica serves xDS, one writes status), else 1 (a file needs no
more). */}}
{{- define "l4xds.controlPlaneReplicas" -}}
{{- $cp := .Values.controlPlane -}}
{{- if kindIs "invalid" $cp.replicas -}}
{{- if ($cp.kubernetes | default dict).enabled -}}2{{- else -}}1{{- end -}}
{{- else -}}
{{- $cp.replicas -}}
{{- end -}}
{{- end -}}

{{/*
tls.auto as a dict with its defaults filled in: a release upgraded with
--reuse-values from a chart version before tls.auto has no tls key.
*/}}
{{- define "l4xds.tlsAuto" -}}
{{- $auto := dig "auto" dict (.Values.tls | default dict) -}}
{{- dict "enabled" (dig "enabled" true $auto) "method" (dig "method" "helm" $auto) "certValidityDuration" (dig "certValidityDuration" 1095 $auto) "certManagerIssuerRef" (dig "certManagerIssuerRef" dict $auto) | toJson -}}
{{- end -}}

{{/*
The Secret the reference control plane reads its server certificate from:
controlPlane.tlsSecretName, else the one tls.auto makes; empty when the
control plane runs in plaintext or has no certificate.
*/}}
{{- define "l4xds.controlPlaneTLSSecret" -}}
{{- $cp := .Values.controlPlane -}}
{{- $auto := include "l4xds.tlsAuto" . | fromJson -}}
{{- if and $cp.enabled (not $cp.insecure) -}}
{{- if $cp.tlsSecretName -}}
{{- $cp.tlsSecretName -}}
{{- else if $auto.enabled -}}
{{- printf "%s-certs" (include "l4xds.controlPlaneName" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The Secret the agents read their client certificate from:
xdsControlPlane.tlsSecretName, else the one tls.auto makes. tls.auto signs
the agents' certificate with the CA that signs the chart's control plane's
(helm, or certmanager without an issuer of yours), so it makes one only for
agents of the chart's control plane, or with your cert-manager issuer, whose
CA your server trusts.
*/}}
{{- define "l4xds.agentTLSSecret" -}}
{{- $xds := .Values.xdsControlPlane -}}
{{- $cp := .Values.controlPlane -}}
{{- $auto := include "l4xds.tlsAuto" . | fromJson -}}
{{- if and $xds.enabled (not $xds.insecure) -}}
{{- if $xds.tlsSecretName -}}
{{- $xds.tlsSecretName -}}
{{- else if and $auto.enabled (or (and $cp.enabled (not $cp.insecure)) (and (eq $auto.method "certmanager") $auto.certManagerIssuerRef)) -}}
{{- printf "%s-agent-certs" (include "l4xds.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The names the control plane's server certificate carries: its Service, as
the agents dial it (<service>.<namespace>.svc), and the shorter forms.
*/}}
{{- define "l4xds.controlPlaneDNSNames" -}}
{{- $svc := include "l4xds.controlPlaneName" . -}}
{{- list $svc (printf "%s.%s" $svc .Release.Namespace) (printf "%s.%s.svc" $svc .Release.Namespace) | toJson -}}
{{- end -}}

{{/* The headless Services of the ServiceMonitors: a Service name has at most
63 characters and <fullname> 49, hence "cp". */}}
{{- define "l4xds.agentMetricsName" -}}
{{- printf "%s-agent-metrics" (include "l4xds.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "l4xds.controlPlaneMetricsName" -}}
{{- printf "%s-cp-metrics" (include "l4xds.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A ServiceMonitor or PodMonitor with nothing to scrape is a mistake: the
agents serve metrics with prometheus.enabled, the control plane is there with
controlPlane.enabled. */}}
{{- define "l4xds.checkMonitor" -}}
{{- if not (or .root.Values.prometheus.enabled .root.Values.controlPlane.enabled) -}}
{{- fail (printf "prometheus.%s.enabled: nothing to scrape: set prometheus.enabled (the agents' metrics) or controlPlane.enabled" .key) -}}
{{- end -}}
{{- end -}}

{{/* Relabelings of the agents' targets: the node's name as a label (the
agents run on the host network, so instance is the node's address). */}}
{{- define "l4xds.agentRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
  action: replace
{{- end -}}
