package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Passwords of deploy/nats/auth.conf's users, given to nats-server through
// its environment as a site would.
var rolePasswords = map[string]string{
	"TOPOSCHED_OPERATOR_PASSWORD": "operator-pw",
	"TOPOSCHED_LAUNCHER_PASSWORD": "launcher-pw",
	"TOPOSCHED_POLICY_PASSWORD":   "policy-pw",
	"TOPOSCHED_AGENT_PASSWORD":    "agent-pw",
	"NATS_SYS_PASSWORD":           "sys-pw",
	"NATS_ROUTE_PASSWORD":         "route-pw",
}

// userPassword is the password of a user of auth.conf.
func userPassword(user string) string {
	switch {
	case user == "operator":
		return rolePasswords["TOPOSCHED_OPERATOR_PASSWORD"]
	case user == "launcher":
		return rolePasswords["TOPOSCHED_LAUNCHER_PASSWORD"]
	case user == "policy-admin":
		return rolePasswords["TOPOSCHED_POLICY_PASSWORD"]
	case strings.HasPrefix(user, "agent-"):
		return rolePasswords["TOPOSCHED_AGENT_PASSWORD"]
	}
	return ""
}

// natsConfDir copies the shipped deploy/nats files into a temporary
// directory (nats-server resolves includes relative to the including
// file) and writes main.conf, including the named files.
func natsConfDir(t *testing.T, includes ...string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(moduleRoot, "deploy", "nats")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".conf") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var main strings.Builder
	for _, inc := range includes {
		fmt.Fprintf(&main, "include ./%s\n", inc)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.conf"), []byte(main.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serverEnv is nats-server's environment: the passwords and extra.
func serverEnv(extra ...string) []string {
	var env []string
	for k, v := range rolePasswords {
		env = append(env, k+"="+v)
	}
	return childEnv(append(env, extra...)...)
}

// securedServer runs nats-server on the shipped standalone.conf (users and
// roles of auth.conf) plus the given includes, on a free loopback port.
func securedServer(t *testing.T, scheme string, includes []string, env ...string) (string, *proc) {
	t.Helper()
	dir := natsConfDir(t, append([]string{"standalone.conf"}, includes...)...)
	port := freePort(t)
	p := startProc(t, "nats-server", serverEnv(append(env, "NATS_STORE_DIR="+t.TempDir())...), bins.natsServer,
		"-c", filepath.Join(dir, "main.conf"), "-a", "127.0.0.1", "-p", fmt.Sprint(port))
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitFor(t, 20*time.Second, func() (bool, string) {
		mustBeAlive(t, p)
		if !strings.Contains(p.output(), "Server is ready") {
			return false, "nats-server has not logged 'Server is ready'"
		}
		return dialable(addr)
	})
	return scheme + "://" + addr, p
}

// asUser is a child environment carrying a user's password the way the
// binaries read it.
func asUser(user string, extra ...string) []string {
	return childEnv(append([]string{"TOPOSCHED_NATS_PASSWORD=" + userPassword(user)}, extra...)...)
}

// roleConn connects as user and records the server's async errors (a
// permission violation arrives as one).
type roleConn struct {
	js   jetstream.JetStream
	mu   sync.Mutex
	errs []string
}

func connectAs(t *testing.T, url, user string, opts ...nats.Option) *roleConn {
	t.Helper()
	rc := &roleConn{}
	opts = append(opts, nats.UserInfo(user, userPassword(user)), nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			rc.mu.Lock()
			rc.errs = append(rc.errs, err.Error())
			rc.mu.Unlock()
		}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	rc.js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// publish publishes through JetStream and returns the error, with the
// server's permission violation when that is why no PubAck came.
func (rc *roleConn) publish(subject, body string) error {
	// A refused publish gets no PubAck; the violation itself arrives at
	// once as an async error, so a second is plenty.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := rc.js.Publish(ctx, subject, []byte(body))
	if err == nil {
		return nil
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, e := range rc.errs {
		if strings.Contains(e, subject) {
			return fmt.Errorf("%w (server: %s)", err, e)
		}
	}
	return err
}

// TestNATSRolePermissions runs the operator on a nats-server configured by
// deploy/nats (users and roles), and checks what each role may publish: a
// launcher submits, finishes and reports telemetry but is refused when it
// publishes a decision or topology or touches the policy bucket; a node's
// agent publishes its own node's topology only; policy push needs the
// policy-admin role.
func TestNATSRolePermissions(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	url, _ := securedServer(t, "nats", nil)

	serve := startProc(t, "toposched serve", asUser("operator"), bins.toposched,
		"serve", "--nats-url", url, "--nats-user", "operator", "--cluster", testdata(t, "two-nodes.yaml"), "--poll", "0")
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return strings.Contains(serve.output(), "services running"), "serve has not logged 'services running'"
	})

	// A wrong password is refused at the door.
	if _, err := nats.Connect(url, nats.UserInfo("launcher", "wrong"), nats.Timeout(5*time.Second)); err == nil ||
		!strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("launcher with a wrong password: %v, want an authorization error", err)
	}

	decision := `{"job_id":"forged","strategy":"blind","ranks":[],"nodes":[]}`
	t.Run("publish", func(t *testing.T) {
		for _, tc := range []struct {
			user, subject string
			allowed       bool
		}{
			{"launcher", "toposched.jobs.submitted", true},
			{"launcher", "toposched.jobs.finished", true},
			{"launcher", "toposched.runtime.telemetry", true},
			{"launcher", "toposched.placement.decided", false},
			{"launcher", "toposched.placement.released", false},
			{"launcher", "toposched.topology.node.gpu-001", false},
			{"launcher", "$KV.toposched-policies.bundle", false},
			{"agent-gpu-001", "toposched.topology.node.gpu-001", true},
			{"agent-gpu-001", "toposched.topology.health.gpu-001", true},
			{"agent-gpu-001", "toposched.topology.node.gpu-002", false},
			{"agent-gpu-001", "toposched.jobs.submitted", false},
			{"agent-gpu-001", "toposched.placement.decided", false},
			{"policy-admin", "toposched.placement.decided", false},
			{"policy-admin", "toposched.jobs.submitted", false},
		} {
			t.Run(tc.user+" "+tc.subject, func(t *testing.T) {
				t.Parallel()
				rc := connectAs(t, url, tc.user)
				body := `{"job_id":"perm-probe","gpus":1}`
				if strings.HasSuffix(tc.subject, "decided") {
					body = decision
				}
				err := rc.publish(tc.subject, body)
				switch {
				case tc.allowed && err != nil:
					t.Fatalf("%s publishing %s: %v, want it stored", tc.user, tc.subject, err)
				case !tc.allowed && err == nil:
					t.Fatalf("%s published %s, want it refused", tc.user, tc.subject)
				case !tc.allowed && !strings.Contains(err.Error(), "Permissions Violation"):
					t.Fatalf("%s publishing %s: %v, want a permissions violation", tc.user, tc.subject, err)
				}
			})
		}
	})

	// The forged decision never reached the placement stream.
	js := connectAs(t, url, "operator").js
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streamPlacement)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s.GetLastMsgForSubject(ctx, subjectDecided); err == nil && strings.Contains(string(m.Data), "forged") {
		t.Errorf("the launcher's forged decision is in %s", streamPlacement)
	} else if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatal(err)
	}

	// The launcher's whole round trip with topoctl: submit, read the
	// decision.
	job := writeJob(t, t.TempDir(), "secure-1", 8)
	r := runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl, "--nats-url", url, "--nats-user", "launcher", "submit", job, "--wait")
	if r.code != 0 || !strings.Contains(r.stdout, "secure-1: decided") {
		t.Errorf("topoctl submit --wait as launcher: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// Policy push: refused to a launcher, done by policy-admin.
	dir := filepath.Join(moduleRoot, "policies", "default")
	r = runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl, "--nats-url", url, "--nats-user", "launcher", "policy", "push", dir, "--timeout", "5s")
	if r.code == 0 {
		t.Errorf("topoctl policy push as launcher succeeded:\n%s", r.stdout)
	}
	r = runCmd(t, 60*time.Second, asUser("policy-admin"), bins.topoctl, "--nats-url", url, "--nats-user", "policy-admin", "policy", "push", dir)
	if r.code != 0 {
		t.Errorf("topoctl policy push as policy-admin: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestNATSTLS runs nats-server with deploy/nats/tls.conf (mutual TLS, a
// certificate generated here) and the operator and topoctl with
// --nats-tls-ca/--nats-tls-cert/--nats-tls-key; a client without a
// certificate is refused.
func TestNATSTLS(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	pki := newTestPKI(t)
	url, _ := securedServer(t, "tls", []string{"tls.conf"},
		"NATS_TLS_CA="+pki.ca, "NATS_TLS_CERT="+pki.serverCert, "NATS_TLS_KEY="+pki.serverKey)
	tlsFlags := []string{"--nats-tls-ca", pki.ca, "--nats-tls-cert", pki.clientCert, "--nats-tls-key", pki.clientKey}

	serve := startProc(t, "toposched serve", asUser("operator"), bins.toposched,
		append([]string{"serve", "--nats-url", url, "--nats-user", "operator", "--cluster", testdata(t, "two-nodes.yaml"), "--poll", "0"}, tlsFlags...)...)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return strings.Contains(serve.output(), "services running"), "serve has not logged 'services running'"
	})
	job := writeJob(t, t.TempDir(), "tls-1", 8)
	r := runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl,
		append([]string{"--nats-url", url, "--nats-user", "launcher", "submit", job, "--wait"}, tlsFlags...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "tls-1: decided") {
		t.Errorf("topoctl over TLS: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl,
		"--nats-url", url, "--nats-user", "launcher", "--nats-tls-ca", pki.ca, "submit", writeJob(t, t.TempDir(), "tls-2", 8))
	if r.code == 0 {
		t.Errorf("topoctl without a client certificate connected:\n%s", r.stdout)
	}
}

// testPKI is a CA and two certificates it signed, in PEM files.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	now := time.Now()
	caKey := key()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toposched e2e CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	var out testPKI
	out.ca = write("ca.pem", "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (string, string) {
		k := key()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kder)
	}
	out.serverCert, out.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth)
	out.clientCert, out.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth)
	return out
}
