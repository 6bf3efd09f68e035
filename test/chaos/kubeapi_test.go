// SPDX-License-Identifier: Apache-2.0

package chaos

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/l4xds/l4xds/test/netns"
	"github.com/l4xds/l4xds/test/ports"
)

// kubeAPI is a real kube-apiserver and its etcd, run by the test as
// processes (the binaries the kind harness builds), which the schedule
// pauses and restarts. The test talks to it in plain REST with an
// administrator's token: this module has no client-go.
type kubeAPI struct {
	dir        string
	host       string
	kubeconfig string
	http       *http.Client

	etcd, api *netns.Proc
	apiArgs   []string
	procs     []*netns.Proc
}

const kubeToken = "l4xds-chaos-admin"

// kubeBinDir is where test/kind/build-node-image.sh puts the Kubernetes
// and etcd binaries: $L4XDS_CACHE/build/bin, as the control plane's
// Kubernetes source tests find them.
func kubeBinDir() string {
	cache := os.Getenv("L4XDS_CACHE")
	if cache == "" {
		cache = "/var/cache/l4xds"
	}
	return filepath.Join(cache, "build", "bin")
}

// requireKubeBinaries skips the test without etcd and kube-apiserver, or
// fails it under L4XDS_KIND_REQUIRED=1 (CI, where the kind tier built them).
func requireKubeBinaries(t *testing.T) {
	t.Helper()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(kubeBinDir(), b)); err != nil {
			msg := fmt.Sprintf("needs %s from the kind harness's build (test/kind/build-node-image.sh, run by make test-kind as root; L4XDS_CACHE=%q): %v", b, os.Getenv("L4XDS_CACHE"), err)
			if os.Getenv("L4XDS_KIND_REQUIRED") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

func (k *kubeAPI) start(name string, args ...string) (*netns.Proc, error) {
	cmd := exec.Command(filepath.Join(kubeBinDir(), name), args...)
	// The kernel ends them if the test dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := netns.StartProc(name, cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	k.procs = append(k.procs, p)
	return p, nil
}

// startKubeAPI runs etcd and kube-apiserver on fixed loopback ports (below
// the ephemeral range, so that a restarted API server finds its port free)
// and waits until the API server is ready. It writes a kubeconfig for the
// control planes.
func startKubeAPI(t *testing.T, dir string) *kubeAPI {
	t.Helper()
	port := ports.Free(t, "tcp", 3)
	k := &kubeAPI{dir: dir, host: "https://127.0.0.1:" + strconv.Itoa(port[2]),
		http: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}}
	t.Cleanup(func() {
		for _, p := range k.procs {
			p.Kill() // a stopped one too
		}
		if t.Failed() {
			for _, p := range []*netns.Proc{k.etcd, k.api} {
				if p != nil {
					t.Logf("%s output (tail):\n%s", p.Name, tail(p.Output(), 20))
				}
			}
		}
	})
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", port[0])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", port[1])
	var err error
	if k.etcd, err = k.start("etcd", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL,
		"--unsafe-no-fsync", "--quota-backend-bytes", "268435456", "--log-level", "warn"); err != nil {
		t.Fatal(err)
	}

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.key")
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte(kubeToken+",admin,admin,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k.apiArgs = []string{"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port[2]),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokens,
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-priority-and-fairness=false",
		"--disable-admission-plugins", "ServiceAccount"}
	if err := k.startAPIServer(); err != nil {
		t.Fatal(err)
	}
	k.kubeconfig = filepath.Join(dir, "kubeconfig")
	config := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: chaos, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: chaos, context: {cluster: chaos, user: admin}}]
current-context: chaos
`, k.host, kubeToken)
	if err := os.WriteFile(k.kubeconfig, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return k
}

// startAPIServer starts kube-apiserver and waits until it is ready.
func (k *kubeAPI) startAPIServer() error {
	p, err := k.start("kube-apiserver", k.apiArgs...)
	if err != nil {
		return err
	}
	k.api = p
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, _, err := k.do(context.Background(), "GET", "/readyz", "", nil)
		if err == nil && code == http.StatusOK {
			return nil
		}
		if p.Exited() || time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready (status %d, %v; exited %t):\n%s", code, err, p.Exited(), tail(p.Output(), 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// do sends one request to the API server; body is marshalled as JSON of
// contentType (application/json when empty).
func (k *kubeAPI) do(ctx context.Context, method, path, contentType string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.host+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+kubeToken)
	if contentType == "" {
		contentType = "application/json"
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := k.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// must is do that wants one of the status codes ok.
func (k *kubeAPI) must(method, path, contentType string, body any, ok ...int) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, out, err := k.do(ctx, method, path, contentType, body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	for _, c := range ok {
		if code == c {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%s %s: status %d: %s", method, path, code, out)
}
