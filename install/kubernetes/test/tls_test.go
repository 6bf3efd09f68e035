// SPDX-License-Identifier: Apache-2.0

package test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// autoTLS are values with the agents and the chart's control plane and no
// Secret given: tls.auto (on by default) makes the certificates.
func autoTLS(method string) map[string]any {
	return map[string]any{
		"xdsControlPlane": map[string]any{"enabled": true},
		"controlPlane":    map[string]any{"enabled": true, "xdsResources": "resource: {}\n"},
		"tls":             map[string]any{"auto": map[string]any{"method": method}},
	}
}

// mountedSecrets are the Secrets the agents and the control plane mount.
func mountedSecrets(t *testing.T, r *rendered) (agent, controlPlane string) {
	t.Helper()
	ds := only[*appsv1.DaemonSet](t, r)
	if v := volume(t, ds.Spec.Template.Spec, "xds-tls"); v.Secret != nil {
		agent = v.Secret.SecretName
	}
	dep := only[*appsv1.Deployment](t, r)
	if v := volume(t, dep.Spec.Template.Spec, "tls"); v.Secret != nil {
		controlPlane = v.Secret.SecretName
	}
	return agent, controlPlane
}

// dialedName is the host the agents dial, from their xds-server-address:
// the name the server certificate must carry.
func dialedName(t *testing.T, r *rendered) string {
	t.Helper()
	cm := checkAgent(t, r)
	host, _, err := net.SplitHostPort(cm.Data["xds-server-address"])
	if err != nil {
		t.Fatalf("xds-server-address %q: %v", cm.Data["xds-server-address"], err)
	}
	return host
}

func secretsOf(r *rendered) map[string]*corev1.Secret {
	out := map[string]*corev1.Secret{}
	for _, s := range find[*corev1.Secret](r) {
		out[s.Name] = s
	}
	return out
}

func parseCert(t *testing.T, what string, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", what)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return c
}

// handshake runs mTLS between the two Secrets as the binaries configure it:
// the server asks for a client certificate of its ca.crt, the client checks
// the server's for the name it dials.
func handshake(t *testing.T, server, client *corev1.Secret, name string) error {
	t.Helper()
	pair := func(s *corev1.Secret) (tls.Certificate, *x509.CertPool) {
		cert, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
		if err != nil {
			t.Fatalf("Secret %s: tls.crt and tls.key: %v", s.Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
			t.Fatalf("Secret %s: ca.crt holds no certificate", s.Name)
		}
		return cert, pool
	}
	sc, sp := pair(server)
	cc, cp := pair(client)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{sc}, ClientCAs: sp, ClientAuth: tls.RequireAndVerifyClientCert})
	cli := tls.Client(b, &tls.Config{Certificates: []tls.Certificate{cc}, RootCAs: cp, ServerName: name})
	errc := make(chan error, 1)
	go func() { errc <- srv.Handshake() }()
	cerr := cli.Handshake()
	if cerr != nil {
		a.Close()
	}
	serr := <-errc
	return errors.Join(cerr, serr)
}

// tls.auto.method=helm, for any release name: a CA and the certificates it
// signs, the server's for the Service name the agents dial, mounted by the
// pods; an mTLS handshake between them succeeds.
func TestTLSAutoHelm(t *testing.T) {
	for _, c := range []struct {
		release  string
		override map[string]any
		fullname string
	}{
		{"l4xds", nil, "l4xds"},
		{"edge", nil, "edge-l4xds"},
		{"lb", map[string]any{"fullnameOverride": "xlb"}, "xlb"},
	} {
		t.Run(c.release+"/"+c.fullname, func(t *testing.T) {
			vals := autoTLS("helm")
			maps.Copy(vals, c.override)
			r, err := renderRelease(t, c.release, vals)
			if err != nil {
				t.Fatal(err)
			}
			checkNames(t, r)
			secrets := secretsOf(r)
			caName, cpName, agentName := c.fullname+"-ca", c.fullname+"-control-plane-certs", c.fullname+"-agent-certs"
			if got, want := slices.Sorted(maps.Keys(secrets)), []string{agentName, caName, cpName}; !slices.Equal(got, want) {
				t.Fatalf("Secrets %v, want %v", got, want)
			}
			agent, cp := mountedSecrets(t, r)
			if agent != agentName || cp != cpName {
				t.Errorf("the agents mount %q and the control plane %q, want %q and %q", agent, cp, agentName, cpName)
			}
			ca := parseCert(t, caName, secrets[caName].Data["ca.crt"])
			if !ca.IsCA {
				t.Errorf("%s: not a CA", caName)
			}
			if _, err := tls.X509KeyPair(secrets[caName].Data["ca.crt"], secrets[caName].Data["ca.key"]); err != nil {
				t.Errorf("%s: ca.key does not go with ca.crt: %v", caName, err)
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			name := dialedName(t, r)
			if want := c.fullname + "-control-plane.kube-system.svc"; name != want {
				t.Errorf("the agents dial %q, want the Service %q", name, want)
			}
			server := parseCert(t, cpName, secrets[cpName].Data["tls.crt"])
			for _, n := range []string{name, c.fullname + "-control-plane", c.fullname + "-control-plane.kube-system"} {
				if _, err := server.Verify(x509.VerifyOptions{Roots: roots, DNSName: n, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("server certificate for %q: %v (SANs %v)", n, err, server.DNSNames)
				}
			}
			client := parseCert(t, agentName, secrets[agentName].Data["tls.crt"])
			if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("client certificate: %v", err)
			}
			for _, s := range []string{cpName, agentName} {
				if secrets[s].Type != corev1.SecretTypeTLS || string(secrets[s].Data["ca.crt"]) != string(secrets[caName].Data["ca.crt"]) {
					t.Errorf("Secret %s: type %q, its ca.crt the CA's: %v", s, secrets[s].Type, string(secrets[s].Data["ca.crt"]) == string(secrets[caName].Data["ca.crt"]))
				}
			}
			if err := handshake(t, secrets[cpName], secrets[agentName], name); err != nil {
				t.Errorf("mTLS between the control plane's and the agents' certificates: %v", err)
			}
			if err := handshake(t, secrets[cpName], secrets[agentName], "xds.example.internal"); err == nil {
				t.Error("the server certificate is accepted for a name it was not made for")
			}
		})
	}
}

// The manual Secrets stay an option: a tlsSecretName is mounted as given
// and tls.auto makes nothing for it.
func TestTLSManualSecrets(t *testing.T) {
	for _, method := range []string{"helm", "certmanager"} {
		vals := autoTLS(method)
		vals["xdsControlPlane"].(map[string]any)["tlsSecretName"] = "agent-tls"
		vals["controlPlane"].(map[string]any)["tlsSecretName"] = "cp-tls"
		r, err := render(t, vals)
		if err != nil {
			t.Fatal(err)
		}
		if agent, cp := mountedSecrets(t, r); agent != "agent-tls" || cp != "cp-tls" {
			t.Errorf("%s: mounted %q and %q, want the given agent-tls and cp-tls", method, agent, cp)
		}
		for _, o := range r.Objects {
			if o.Kind == "Secret" || o.Kind == "Certificate" || o.Kind == "Issuer" {
				t.Errorf("%s with both Secrets given: the chart renders %s/%s", method, o.Kind, o.Name)
			}
		}
	}
}

// apiServer answers what Helm's lookup asks about Secrets, from the Secrets
// of the releases applied to it: the cluster as Helm left it.
type apiServer struct {
	*httptest.Server
	mu      sync.Mutex
	secrets map[string][]byte // name -> JSON
}

func newAPIServer(t *testing.T) *apiServer {
	s := &apiServer{secrets: map[string][]byte{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1" {
			io.WriteString(w, `{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"v1","resources":[{"name":"secrets","singularName":"secret","namespaced":true,"kind":"Secret","verbs":["get"]}]}`)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/"+namespace+"/secrets/")
		s.mu.Lock()
		body, found := s.secrets[name]
		s.mu.Unlock()
		if r.Method != http.MethodGet || !ok || !found {
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
			return
		}
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

// apply stores the Secrets of a release's manifest, as the API server
// holds them once Helm applied it.
func (s *apiServer) apply(t *testing.T, rel *release.Release) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, doc := range releaseutil.SplitManifests(rel.Manifest) {
		obj, err := decode("release "+rel.Name, doc)
		if err != nil {
			t.Fatal(err)
		}
		if obj == nil {
			continue
		}
		if sec, ok := obj.Obj.(*corev1.Secret); ok {
			sec.APIVersion, sec.Kind = "v1", "Secret"
			if s.secrets[sec.Name], err = json.Marshal(sec); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func (s *apiServer) delete(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.secrets, name)
}

// restGetter gives Helm the fake API server's address: Helm's engine makes
// its lookup function from it.
type restGetter struct{ url string }

func (g restGetter) ToRESTConfig() (*rest.Config, error) { return &rest.Config{Host: g.url}, nil }
func (g restGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return nil, errors.New("the fake API server serves lookups only")
}
func (g restGetter) ToRESTMapper() (meta.RESTMapper, error) {
	return nil, errors.New("the fake API server serves lookups only")
}

func releaseSecrets(t *testing.T, rel *release.Release) map[string]map[string][]byte {
	t.Helper()
	out := map[string]map[string][]byte{}
	for _, doc := range releaseutil.SplitManifests(rel.Manifest) {
		obj, err := decode("release "+rel.Name, doc)
		if err != nil {
			t.Fatal(err)
		}
		if obj == nil {
			continue
		}
		if sec, ok := obj.Obj.(*corev1.Secret); ok {
			out[sec.Name] = sec.Data
		}
	}
	return out
}

// tls.auto.method=helm keeps the CA and the certificates across helm
// upgrade (Helm's action package; its lookup asks an API server that holds
// what the previous revision applied). A deleted certificate is made again
// by the same CA; a deleted CA makes everything new.
func TestTLSAutoHelmKeptAcrossUpgrade(t *testing.T) {
	api := newAPIServer(t)
	cfg := helmConfig(t)
	cfg.RESTClientGetter = restGetter{api.URL}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = "edge", namespace
	rel, err := install.Run(loadChart(t), autoTLS("helm"))
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	api.apply(t, rel)
	first := releaseSecrets(t, rel)
	if len(first) != 3 {
		t.Fatalf("Secrets %v, want the CA, the control plane's and the agents'", slices.Sorted(maps.Keys(first)))
	}

	upgrade := func(set map[string]any) map[string]map[string][]byte {
		t.Helper()
		u := action.NewUpgrade(cfg)
		u.Namespace, u.ReuseValues = namespace, true
		rel, err := u.Run("edge", loadChart(t), set)
		if err != nil {
			t.Fatalf("helm upgrade: %v", err)
		}
		api.apply(t, rel)
		return releaseSecrets(t, rel)
	}
	// An upgrade that changes a value: every Secret as it was.
	second := upgrade(map[string]any{"debug": true})
	for name, data := range first {
		if !maps.EqualFunc(data, second[name], func(a, b []byte) bool { return string(a) == string(b) }) {
			t.Errorf("helm upgrade changed Secret %s", name)
		}
	}

	// The control plane's certificate deleted: a new one, by the same CA.
	api.delete("edge-l4xds-control-plane-certs")
	third := upgrade(nil)
	if string(third["edge-l4xds-control-plane-certs"]["tls.crt"]) == string(first["edge-l4xds-control-plane-certs"]["tls.crt"]) {
		t.Error("the deleted server certificate was not made again")
	}
	for _, name := range []string{"edge-l4xds-ca", "edge-l4xds-agent-certs"} {
		if string(third[name]["tls.crt"])+string(third[name]["ca.crt"]) != string(first[name]["tls.crt"])+string(first[name]["ca.crt"]) {
			t.Errorf("deleting the server certificate changed %s", name)
		}
	}
	sec := func(name string, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{Data: data}
	}
	if err := handshake(t, sec("server", third["edge-l4xds-control-plane-certs"]), sec("agent", third["edge-l4xds-agent-certs"]), "edge-l4xds-control-plane.kube-system.svc"); err != nil {
		t.Errorf("the new server certificate with the kept agent certificate: %v", err)
	}

	// The CA deleted: a new CA, and certificates it signed.
	api.delete("edge-l4xds-ca")
	fourth := upgrade(nil)
	for name := range first {
		if string(fourth[name]["ca.crt"]) == string(first[name]["ca.crt"]) {
			t.Errorf("the CA was deleted, yet %s keeps the old ca.crt", name)
		}
	}
	if err := handshake(t, sec("server", fourth["edge-l4xds-control-plane-certs"]), sec("agent", fourth["edge-l4xds-agent-certs"]), "edge-l4xds-control-plane.kube-system.svc"); err != nil {
		t.Errorf("the certificates of the new CA: %v", err)
	}
}

// certificateSpec is the part of a cert-manager Certificate the test reads.
type certificateSpec struct {
	SecretName string   `json:"secretName"`
	CommonName string   `json:"commonName"`
	DNSNames   []string `json:"dnsNames"`
	IsCA       bool     `json:"isCA"`
	Usages     []string `json:"usages"`
	IssuerRef  struct {
		Name, Kind, Group string
	} `json:"issuerRef"`
}

func certificates(t *testing.T, r *rendered) map[string]certificateSpec {
	t.Helper()
	out := map[string]certificateSpec{}
	for _, o := range r.Objects {
		if o.Kind != "Certificate" {
			continue
		}
		spec, _, _ := unstructured.NestedMap(o.Obj.(*unstructured.Unstructured).Object, "spec")
		data, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		var c certificateSpec
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatal(err)
		}
		out[o.Name] = c
	}
	return out
}

// tls.auto.method=certmanager: Certificates for the Secrets the pods mount,
// the server's with the Service names the agents dial, from a CA of the
// release's own or from the given issuer; the same objects on upgrade (the
// Secrets are cert-manager's, which keeps and renews them).
func TestTLSAutoCertManager(t *testing.T) {
	vals := autoTLS("certmanager")
	r, err := renderRelease(t, "edge", vals)
	if err != nil {
		t.Fatal(err)
	}
	checkNames(t, r)
	want := []string{
		"Certificate/edge-l4xds-agent", "Certificate/edge-l4xds-ca", "Certificate/edge-l4xds-control-plane",
		"Issuer/edge-l4xds-ca", "Issuer/edge-l4xds-selfsigned",
	}
	var got []string
	for _, k := range kindsOf(r) {
		if strings.HasPrefix(k, "Certificate/") || strings.HasPrefix(k, "Issuer/") || strings.HasPrefix(k, "Secret/") {
			got = append(got, k)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("objects %v, want %v (and no Secret: cert-manager makes them)", got, want)
	}
	certs := certificates(t, r)
	agent, cp := mountedSecrets(t, r)
	name := dialedName(t, r)
	server, client, ca := certs["edge-l4xds-control-plane"], certs["edge-l4xds-agent"], certs["edge-l4xds-ca"]
	if server.SecretName != cp || client.SecretName != agent {
		t.Errorf("Certificates write %q and %q, the pods mount %q and %q", server.SecretName, client.SecretName, cp, agent)
	}
	if !slices.Contains(server.DNSNames, name) || !slices.Contains(server.Usages, "server auth") {
		t.Errorf("server Certificate %+v: want the name the agents dial, %q, and server auth", server, name)
	}
	if len(client.DNSNames) != 0 || !slices.Contains(client.Usages, "client auth") {
		t.Errorf("agent Certificate %+v: want client auth, no DNS names", client)
	}
	if !ca.IsCA || ca.IssuerRef.Name != "edge-l4xds-selfsigned" || ca.SecretName != "edge-l4xds-ca" {
		t.Errorf("CA Certificate %+v", ca)
	}
	for n, c := range map[string]certificateSpec{"server": server, "agent": client} {
		if c.IssuerRef.Name != "edge-l4xds-ca" || c.IssuerRef.Kind != "Issuer" {
			t.Errorf("%s Certificate issued by %+v, want the release's CA Issuer", n, c.IssuerRef)
		}
	}

	// An issuer of yours: no CA of the release's, both Certificates from
	// it; with it, agents of another xDS server get a certificate too.
	issuer := map[string]any{"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}
	vals = autoTLS("certmanager")
	vals["tls"].(map[string]any)["auto"].(map[string]any)["certManagerIssuerRef"] = issuer
	vals["controlPlane"] = map[string]any{"enabled": false}
	vals["xdsControlPlane"] = map[string]any{"enabled": true, "serverAddress": "xds.example.internal:9000"}
	r, err = renderRelease(t, "edge", vals)
	if err != nil {
		t.Fatal(err)
	}
	certs = certificates(t, r)
	if len(certs) != 1 || certs["edge-l4xds-agent"].IssuerRef.Name != "corp-ca" || certs["edge-l4xds-agent"].IssuerRef.Kind != "ClusterIssuer" {
		t.Errorf("with the issuer corp-ca and another server: Certificates %+v, want the agents' alone, from corp-ca", certs)
	}
	if slices.ContainsFunc(r.Objects, func(o object) bool { return o.Kind == "Issuer" }) {
		t.Error("an Issuer is rendered although certManagerIssuerRef is given")
	}

	// helm upgrade renders the same Certificates.
	cfg := helmConfig(t)
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = "edge", namespace
	rel1, err := install.Run(loadChart(t), autoTLS("certmanager"))
	if err != nil {
		t.Fatal(err)
	}
	u := action.NewUpgrade(cfg)
	u.Namespace, u.ReuseValues = namespace, true
	rel2, err := u.Run("edge", loadChart(t), map[string]any{"debug": true})
	if err != nil {
		t.Fatal(err)
	}
	certDocs := func(rel *release.Release) []string {
		var out []string
		for _, doc := range releaseutil.SplitManifests(rel.Manifest) {
			if strings.Contains(doc, "kind: Certificate") || strings.Contains(doc, "kind: Issuer") {
				out = append(out, doc)
			}
		}
		slices.Sort(out)
		return out
	}
	if a, b := certDocs(rel1), certDocs(rel2); len(a) != 5 || !slices.Equal(a, b) {
		t.Errorf("helm upgrade changed the Certificates or Issuers (%d before, %d after)", len(a), len(b))
	}
}

// The docs' trial values (Documentation/kubernetes.md, the kind tier's
// install) render for a release of any name with tls.auto.method=helm's
// certificates.
func TestDocsTrialValues(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, docsFile))
	if err != nil {
		t.Fatal(err)
	}
	var trial string
	for _, m := range regexp.MustCompile("(?s)```yaml\n(# trial\\.yaml\n.*?)```").FindAllStringSubmatch(string(doc), -1) {
		trial = m[1]
	}
	if trial == "" {
		t.Fatalf("%s has no ```yaml block starting with # trial.yaml", docsFile)
	}
	vals, err := chartutil.ReadValues([]byte(trial))
	if err != nil {
		t.Fatalf("the docs' trial.yaml: %v", err)
	}
	r, err := renderRelease(t, "edge", vals)
	if err != nil {
		t.Fatalf("the docs' trial.yaml: %v", err)
	}
	if agent, cp := mountedSecrets(t, r); agent != "edge-l4xds-agent-certs" || cp != "edge-l4xds-control-plane-certs" {
		t.Errorf("the docs' trial mounts %q and %q, want tls.auto.method=helm's", agent, cp)
	}
}
