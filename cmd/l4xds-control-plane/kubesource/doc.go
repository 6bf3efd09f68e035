// SPDX-License-Identifier: Apache-2.0

package kubesource

import (
	_ "k8s.io/client-go/kubernetes"
	_ "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"
)
