// SPDX-License-Identifier: Apache-2.0

package kind

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The cert-manager release whose CRDs the chart's tls.auto.method=certmanager
// objects are checked against: its Go module holds them (deploy/crds), so
// they come from Go's module cache, fetched once through the module proxy
// like every module this tier builds.
const certManagerModule = "github.com/cert-manager/cert-manager@v1.21.2"

// autoCerts returns the Secrets tls.auto.method=helm made, each as a hash
// of its data.
func (c *cluster) autoCerts(t *testing.T) map[string]string {
	t.Helper()
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Data     map[string]string
		}
	}
	c.kubectlJSON(t, &list, "-n", ns, "get", "secret", fullname+"-ca", cpName+"-certs", fullname+"-agent-certs", "-o", "json")
	out := map[string]string{}
	for _, s := range list.Items {
		data, err := json.Marshal(s.Data)
		if err != nil {
			t.Fatal(err)
		}
		out[s.Metadata.Name] = fmt.Sprintf("%x", sha256.Sum256(data))[:12]
	}
	if len(out) != 3 {
		t.Fatalf("Secrets of tls.auto.method=helm: %v, want 3", out)
	}
	return out
}

// moduleDir is the directory of a module version in Go's module cache,
// downloaded first if it is not there.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", module, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s: %v %s %s", module, err, m.Error, out)
	}
	return m.Dir
}

// applyCRDs applies CRD files server-side (they are too large for the
// last-applied annotation) and waits until they are served.
func (c *cluster) applyCRDs(t *testing.T, files []string, crds []string) {
	t.Helper()
	args := []string{"apply", "--server-side"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	// A kind apiserver under load can refuse a large write for a moment.
	for attempt := 1; ; attempt++ {
		_, err := c.run("kubectl", args...)
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("applying %v, attempt %d: %v", files, attempt, err)
		time.Sleep(2 * time.Second)
	}
	// kubectl wait fails at once (.status.conditions accessor error) on a
	// CRD whose status the API server has not written yet: ask again.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.run("kubectl", append([]string{"wait", "--for", "condition=Established", "--timeout", "1m"}, crds...)...)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
}

// certManagerObjects: the Issuers and Certificates of
// tls.auto.method=certmanager, for the docs' trial values and this release,
// are accepted by the real API server with cert-manager's CRDs (a server-side
// dry run with strict field validation: no cert-manager runs here to issue
// them); a misspelt field is not.
func (c *cluster) certManagerObjects(t *testing.T, docs string) {
	dir := filepath.Join(moduleDir(t, certManagerModule), "deploy", "crds")
	c.applyCRDs(t,
		[]string{filepath.Join(dir, "cert-manager.io_certificates.yaml"), filepath.Join(dir, "cert-manager.io_issuers.yaml")},
		[]string{"crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io"})
	t.Logf("cert-manager CRDs from %s", dir)
	for _, tc := range []struct {
		set  string
		want int
	}{
		{"tls.auto.method=certmanager", 5},
		{"tls.auto.method=certmanager,tls.auto.certManagerIssuerRef.name=corp-ca,tls.auto.certManagerIssuerRef.kind=ClusterIssuer", 2},
	} {
		manifest := c.sh(t, docs, fmt.Sprintf("helm template %s install/kubernetes/l4xds -n %s -f trial.yaml --kube-version 1.34.4 --set %s --show-only templates/tls-certmanager.yaml", release, ns, tc.set))
		out := c.dryRun(t, manifest)
		if n := strings.Count(out, "(server dry run)"); n != tc.want {
			t.Errorf("--set %s: %d objects accepted, want %d:\n%s", tc.set, n, tc.want, out)
		}
	}
	// The dry run checks the schema: a misspelt field is refused.
	bad := fmt.Sprintf("apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: typo, namespace: %s}\nspec: {secretName: s, dnsName: [x], issuerRef: {name: i}}\n", ns)
	cmd := exec.Command("kubectl", "apply", "--dry-run=server", "--validate=strict", "-f", "-")
	cmd.Stdin = strings.NewReader(bad)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "dnsName") {
		t.Errorf("a Certificate with spec.dnsName was not refused (%v):\n%s", err, out)
	}
}

// dryRun applies a manifest with a server-side dry run and strict field
// validation, and returns kubectl's output.
func (c *cluster) dryRun(t *testing.T, manifest string) string {
	t.Helper()
	cmd := exec.Command("kubectl", "apply", "--dry-run=server", "--validate=strict", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	out, err := cmd.CombinedOutput()
	t.Logf("kubectl apply --dry-run=server:\n%s", out)
	if err != nil {
		t.Fatalf("the API server refused the chart's objects: %v", err)
	}
	return string(out)
}
