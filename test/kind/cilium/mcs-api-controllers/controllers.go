// SPDX-License-Identifier: Apache-2.0

// Package controllers stands in for sigs.k8s.io/mcs-api/controllers v0.5.2,
// which Cilium's operator requires but the Go module proxy does not serve
// ("This module version is not available"). The operator uses one constant
// of it (and names its ServiceImportReconciler in an error string); the value
// is the one Cilium's own tests expect (operator/pkg/model/ingestion).
// build-images.sh builds the operator with this directory replacing the
// module, in a copy of cilium/go.mod (go build -modfile).
package controllers

// DerivedServiceAnnotation is set on the Service derived from a ServiceImport.
const DerivedServiceAnnotation = "multicluster.kubernetes.io/derived-service"
