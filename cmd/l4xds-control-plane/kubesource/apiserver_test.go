// SPDX-License-Identifier: Apache-2.0

package kubesource_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/l4xds/l4xds/test/ports"
)

// apiServer is a kube-apiserver and its etcd, run as local processes.
type apiServer struct {
	Config *rest.Config
	Dir    string
}

// kindBinDir is where test/kind/build-node-image.sh puts the Kubernetes and
// etcd binaries it builds: $L4XDS_CACHE/build/bin.
func kindBinDir() string {
	cache := os.Getenv("L4XDS_CACHE")
	if cache == "" {
		cache = "/var/cache/l4xds"
	}
	return filepath.Join(cache, "build", "bin")
}

func freePort(t *testing.T) int {
	t.Helper()
	return ports.Free(t, "tcp", 1)[0]
}

// startProcess starts a binary whose output goes to a log file in dir, and
// stops it (by its PID) at the end of the test. The kernel kills it if the
// test process dies first.
func startProcess(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(kindBinDir(), name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			if len(out) > 4000 {
				out = out[len(out)-4000:]
			}
			t.Logf("%s log (tail):\n%s", name, out)
		}
	})
}

// startAPIServer runs etcd and kube-apiserver (the versions the kind
// harness builds) on loopback ports, dual stack, with a token for an
// administrator and no authorization checks.
func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	dir := kindBinDir()
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			msg := fmt.Sprintf("needs %s from the kind harness's build (test/kind/build-node-image.sh, run by make test-kind as root; L4XDS_CACHE=%q): %v", b, os.Getenv("L4XDS_CACHE"), err)
			if os.Getenv("L4XDS_KIND_REQUIRED") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	work := t.TempDir()

	etcdPort, peerPort := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	startProcess(t, work, "etcd",
		"--data-dir", filepath.Join(work, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peerPort),
		"--unsafe-no-fsync", "--quota-backend-bytes", "268435456")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(work, "sa.key")
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "l4xds-test-admin"
	tokens := filepath.Join(work, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	startProcess(t, work, "kube-apiserver",
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(work, "certs"),
		"--token-auth-file", tokens,
		"--authorization-mode", "AlwaysAllow",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/16,fd00:10:96::/112",
		"--enable-priority-and-fairness=false",
		"--disable-admission-plugins", "ServiceAccount")

	host := fmt.Sprintf("https://127.0.0.1:%d", port)
	cfg := &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 100, Burst: 200}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	deadline := time.Now().Add(90 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(context.Background(), "GET", host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-apiserver not ready after 90s: %v", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	return &apiServer{Config: cfg, Dir: work}
}
