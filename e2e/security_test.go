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
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Passwords of deploy/nats/auth.conf's users, given to nats-server through
// its environment as a site would.
var rolePasswords = map[string]string{
	"TOPOSCHED_OPERATOR_PASSWORD": "operator-pw",
	"TOPOSCHED_LAUNCHER_PASSWORD": "launcher-pw",
	"TOPOSCHED_POLICY_PASSWORD":   "policy-pw",
	"NATS_SYS_PASSWORD":           "sys-pw",
	"NATS_ROUTE_PASSWORD":         "route-pw",
}

// userPassword is the password of a user of auth.conf.
func userPassword(user string) string {
	switch user {
	case "operator":
		return rolePasswords["TOPOSCHED_OPERATOR_PASSWORD"]
	case "launcher":
		return rolePasswords["TOPOSCHED_LAUNCHER_PASSWORD"]
	case "policy-admin":
		return rolePasswords["TOPOSCHED_POLICY_PASSWORD"]
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
	return confServer(t, natsConfDir(t, append([]string{"standalone.conf"}, includes...)...), scheme, env...)
}

// confServer runs nats-server on dir's main.conf on a free loopback port.
func confServer(t *testing.T, dir, scheme string, env ...string) (string, *proc) {
	t.Helper()
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
	nc   *nats.Conn
	js   jetstream.JetStream
	mu   sync.Mutex
	errs []error
}

func connectAs(t *testing.T, url, user string, opts ...nats.Option) *roleConn {
	t.Helper()
	return connectWith(t, url, user, append(opts, nats.UserInfo(user, userPassword(user)))...)
}

// connectWith connects with the given credentials (who names them).
func connectWith(t *testing.T, url, who string, opts ...nats.Option) *roleConn {
	t.Helper()
	rc := &roleConn{}
	opts = append(opts, nats.Timeout(5*time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			rc.mu.Lock()
			rc.errs = append(rc.errs, err)
			rc.mu.Unlock()
		}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", who, err)
	}
	t.Cleanup(nc.Close)
	rc.nc = nc
	rc.js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// refused reports whether the server answered a publish to subject with a
// permissions violation (it arrives at once, as an async error).
func (rc *roleConn) refused(subject string) (bool, string) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, e := range rc.errs {
		if errors.Is(e, nats.ErrPermissionViolation) && strings.Contains(e.Error(), `"`+subject+`"`) {
			return true, ""
		}
	}
	return false, fmt.Sprintf("no permissions violation for %s among %v", subject, rc.errs)
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
		if strings.Contains(e.Error(), subject) {
			return fmt.Errorf("%w (server: %w)", err, e)
		}
	}
	return err
}

// TestNATSRolePermissions runs the operator on a nats-server configured by
// deploy/nats (standalone.conf and the shipped auth.conf: the password
// users operator, launcher and policy-admin), and checks what each may
// publish: a launcher submits, finishes and reports telemetry, bare or
// under any tenant, but is refused a decision, topology, a node's reports
// (heartbeats, rank exits, finishes under a node) and the policy bucket;
// policy push needs the policy-admin role. (Agents and tenants have no
// password user: TestSecurityRoles signs them in with their nkeys.)
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

	// A wrong password is refused at the door, and so is a user the
	// shipped file no longer has.
	for _, user := range []string{"launcher", "agent-gpu-001"} {
		if _, err := nats.Connect(url, nats.UserInfo(user, "wrong"), nats.Timeout(5*time.Second)); err == nil ||
			!errors.Is(err, nats.ErrAuthorization) {
			t.Errorf("%s with a wrong password: %v, want an authorization error", user, err)
		}
	}

	decision := `{"job_id":"forged","strategy":"blind","ranks":[],"nodes":[]}`
	t.Run("publish", func(t *testing.T) {
		for _, tc := range []struct {
			user, subject string
			allowed       bool
		}{
			{"launcher", "toposched.jobs.submitted", true},
			{"launcher", "toposched.jobs.submitted.tenant.research", true},
			{"launcher", "toposched.jobs.finished", true},
			{"launcher", "toposched.jobs.finished.tenant.research", true},
			{"launcher", "toposched.runtime.telemetry", true},
			{"launcher", "toposched.jobs.finished.node.gpu-001", false},
			{"launcher", "toposched.runtime.telemetry.node.gpu-001", false},
			{"launcher", "toposched.placement.decided", false},
			{"launcher", "toposched.placement.released", false},
			{"launcher", "toposched.topology.node.gpu-001", false},
			{"launcher", "toposched.agent.heartbeat.gpu-001", false},
			{"launcher", "toposched.runtime.ranks_exited.gpu-001", false},
			{"launcher", "$KV.toposched-policies.bundle", false},
			{"policy-admin", "toposched.placement.decided", false},
			{"policy-admin", "toposched.jobs.submitted", false},
			{"policy-admin", "toposched.agent.heartbeat.gpu-001", false},
			{"operator", "toposched.topology.health.gpu-001", true},
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
				case !tc.allowed && !errors.Is(err, nats.ErrPermissionViolation):
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

	// The launcher can neither stop nor bend the services through
	// JetStream's API, and its own work with topoctl goes on.
	op := connectAs(t, url, "operator").js
	readerCannotTouchServices(t, "launcher", url, []string{"--user", "launcher", "--password", userPassword("launcher")}, connectAs(t, url, "launcher"), op)
	launcherRoundTrip(t, url, asUser("launcher"), []string{"--nats-user", "launcher"}, "secure-1")

	// Policy push: refused to a launcher, done by policy-admin.
	dir := filepath.Join(moduleRoot, "policies", "default")
	r := runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl, "--nats-url", url, "--nats-user", "launcher", "policy", "push", dir, "--timeout", "5s")
	if r.code == 0 {
		t.Errorf("topoctl policy push as launcher succeeded:\n%s", r.stdout)
	}
	r = runCmd(t, 60*time.Second, asUser("policy-admin"), bins.topoctl, "--nats-url", url, "--nats-user", "policy-admin", "policy", "push", dir)
	if r.code != 0 {
		t.Errorf("topoctl policy push as policy-admin: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// Calibration push: the same, and the launcher can still read it.
	cal := filepath.Join(t.TempDir(), "lab.json")
	if err := os.WriteFile(cal, []byte(`{"version": 1, "name": "lab", "efficiency": {"pcie": 0.7}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r = runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl, "--nats-url", url, "--nats-user", "launcher", "calibration", "push", cal, "--timeout", "5s")
	if r.code == 0 {
		t.Errorf("topoctl calibration push as launcher succeeded:\n%s", r.stdout)
	}
	r = runCmd(t, 60*time.Second, asUser("policy-admin"), bins.topoctl, "--nats-url", url, "--nats-user", "policy-admin", "calibration", "push", cal)
	if r.code != 0 || !strings.Contains(r.stdout, "applied by") {
		t.Errorf("topoctl calibration push as policy-admin: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, 60*time.Second, asUser("launcher"), bins.topoctl, "--nats-url", url, "--nats-user", "launcher", "calibration", "show")
	if r.code != 0 || !strings.Contains(r.stdout, "lab@") {
		t.Errorf("topoctl calibration show as launcher: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// serviceConsumers are the durable consumers the readers
// (readerCannotTouchServices) try to break, with the filters each must
// keep: an identity-scoped event's consumer reads its bare subject and
// every scope under it.
var serviceConsumers = []struct {
	stream, name string
	filters      []string
}{
	{streamJobs, durableAnalysis, []string{subjectSubmitted, subjectSubmitted + ".>"}},
	{streamJobs, "placement-jobs-finished", []string{"toposched.jobs.finished", "toposched.jobs.finished.>"}},
	{streamJobs, durablePlacementAnalyzed, []string{"toposched.jobs.analyzed"}},
	{streamTopology, durablePlacementTopology, []string{"toposched.topology.>"}},
	{streamPlacement, durableOptimizerDecided, []string{"toposched.placement.>"}},
}

// consumerFilters are a consumer's filter subjects, one or several.
func consumerFilters(ci *jetstream.ConsumerInfo) []string {
	if ci.Config.FilterSubject != "" {
		return []string{ci.Config.FilterSubject}
	}
	return ci.Config.FilterSubjects
}

// readerCannotTouchServices runs the nats CLI with a reader's credentials
// (who: a launcher, a tenant, an agent; auth: its flags) against the
// services' streams and durable consumers: delete, edit or re-create a
// consumer, delete, purge or edit a stream; and pulls from a service's
// durable through the reader's own connection. Each must be refused, and
// afterwards every consumer and stream is as it was (checked as the
// operator, js).
func readerCannotTouchServices(t *testing.T, who, url string, auth []string, launcher *roleConn, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	jobs, err := js.Stream(ctx, streamJobs)
	if err != nil {
		t.Fatal(err)
	}
	jobsInfo, err := jobs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Run(who+" refused", func(t *testing.T) {
		for _, args := range [][]string{
			{"consumer", "rm", streamJobs, durableAnalysis, "-f"},
			{"consumer", "rm", streamPlacement, durableOptimizerDecided, "-f"},
			{"consumer", "edit", streamJobs, "placement-jobs-finished", "--filter", "toposched.jobs.nothing", "-f"},
			{"consumer", "add", streamJobs, durableAnalysis, "--filter", "toposched.jobs.nothing", "--pull", "--defaults"},
			{"consumer", "add", streamTopology, durablePlacementTopology, "--filter", "toposched.topology.nothing", "--pull", "--defaults"},
			{"stream", "rm", streamPlacement, "-f"},
			{"stream", "purge", streamJobs, "-f"},
			{"stream", "edit", streamJobs, "--max-age", "1m", "-f"},
		} {
			t.Run(strings.Join(args[:3], " "), func(t *testing.T) {
				t.Parallel()
				full := append(append(append([]string{}, auth...), "--timeout", "2s"), args...)
				if r := natsCLIResult(t, url, full...); r.code == 0 {
					t.Errorf("nats %s as %s succeeded:\n%s%s", strings.Join(args, " "), who, r.stdout, r.stderr)
				}
			})
		}
	})
	// A pull from a service's durable would take its messages away; the
	// server refuses the request itself.
	next := "$JS.API.CONSUMER.MSG.NEXT." + streamJobs + "." + durableAnalysis
	if err := launcher.nc.PublishRequest(next, launcher.nc.NewRespInbox(), []byte(`{"batch":1,"no_wait":true}`)); err != nil {
		t.Fatal(err)
	}
	if err := launcher.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(10 * time.Second); ; <-tick.C {
		ok, state := launcher.refused(next)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%s pulling from %s: %s", who, durableAnalysis, state)
			break
		}
	}
	for _, c := range serviceConsumers {
		ci, err := consumerInfo(js, c.stream, c.name)
		switch {
		case err != nil:
			t.Errorf("after the reader's attempts, consumer %s on %s: %v", c.name, c.stream, err)
		case !slices.Equal(consumerFilters(ci), c.filters):
			t.Errorf("after the reader's attempts, consumer %s filters %q, want %q", c.name, consumerFilters(ci), c.filters)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{streamJobs, streamPlacement} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Errorf("after the reader's attempts, stream %s: %v", name, err)
			continue
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if name == streamJobs && (info.Config.MaxAge != jobsInfo.Config.MaxAge || info.State.Msgs < jobsInfo.State.Msgs) {
			t.Errorf("after the reader's attempts, %s has max age %s and %d messages, was %s and %d",
				name, info.Config.MaxAge, info.State.Msgs, jobsInfo.Config.MaxAge, jobsInfo.State.Msgs)
		}
	}
}

// launcherRoundTrip is what a launcher (or, with --tenant in auth, a
// tenant's user) does with topoctl (env and flags: its credentials):
// submit and wait for the decision, watch, finish, accept a migration
// (refused: none was proposed, but the answer comes), explain.
func launcherRoundTrip(t *testing.T, url string, env, auth []string, id string) {
	t.Helper()
	tc := func(args ...string) []string {
		return append(append([]string{"--nats-url", url}, auth...), args...)
	}
	watch := startProc(t, "topoctl watch ("+id+")", env, bins.topoctl, tc("watch", "--all", "-o", "json")...)
	job := writeJob(t, t.TempDir(), id, 8)
	r := runCmd(t, 60*time.Second, env, bins.topoctl, tc("submit", job, "--wait")...)
	if r.code != 0 || !strings.Contains(r.stdout, id+": decided") {
		t.Errorf("topoctl submit --wait as launcher: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, watch)
		for _, ev := range parseTopoctlJSON(t, watch.output()) {
			if ev.Event == "placement.decided" && strings.Contains(string(ev.Data), `"job_id":"`+id+`"`) {
				return true, ""
			}
		}
		return false, "topoctl watch as launcher has not shown the decision of " + id
	})
	r = runCmd(t, 60*time.Second, env, bins.topoctl, tc("migrate", "accept", id, "--wait", "--timeout", "30s")...)
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "refused") || strings.Contains(r.stdout+r.stderr, "ermission") {
		t.Errorf("topoctl migrate accept --wait as launcher: exit %d, want placement's refusal\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, 60*time.Second, env, bins.topoctl, tc("finish", id)...)
	if r.code != 0 || !strings.Contains(r.stdout, "finished "+id) {
		t.Errorf("topoctl finish as launcher: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, 60*time.Second, env, bins.topoctl, tc("explain", id)...)
	if r.code != 0 || !strings.Contains(r.stdout, "jobs.submitted") {
		t.Errorf("topoctl explain as launcher: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
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

// TestServeOpenListenRequiresGeneratedCredentials runs serve's embedded
// server on every interface (--listen 0.0.0.0:PORT; the test dials
// 127.0.0.1 only). serve generates the operator's, launcher's and
// policy-admin's nkeys in its data dir, private files whose paths it logs
// and whose seeds it does not; anonymous clients are refused; the
// launcher's key has the launcher role (refused what
// TestNATSRolePermissions refuses, topoctl's round trip works). An agent's
// and a tenant's keys issued while serve runs (toposched roles issue) sign
// in within a second: the agent publishes its own node's health only; a
// seed removed is a user signed out; a restart keeps the keys.
func TestServeOpenListenRequiresGeneratedCredentials(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	data := t.TempDir()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	start := func(name string) *proc {
		p := startProc(t, name, childEnv(), bins.toposched, "serve", "--cluster", testdata(t, "two-nodes.yaml"),
			"--listen", fmt.Sprintf("0.0.0.0:%d", port), "--data-dir", data, "--poll", "0")
		waitFor(t, 30*time.Second, func() (bool, string) {
			mustBeAlive(t, p)
			if !strings.Contains(p.output(), "services running") {
				return false, name + " has not logged 'services running'"
			}
			return dialable(fmt.Sprintf("127.0.0.1:%d", port))
		})
		return p
	}
	serve := start("toposched serve --listen 0.0.0.0")

	dir := credentialsDir(data)
	if st, err := os.Stat(dir); err != nil {
		t.Fatalf("credentials dir: %v", err)
	} else if st.Mode().Perm() != 0o700 {
		t.Errorf("credentials dir %s: mode %v, want 0700", dir, st.Mode().Perm())
	}
	seeds := map[string]string{}
	checkSeed := func(role string, logged bool) {
		t.Helper()
		file := filepath.Join(dir, role+".nk")
		st, err := os.Stat(file)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", file, st.Mode().Perm())
		}
		body, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		seeds[role] = string(body)
		if logged && !strings.Contains(serve.output(), file) {
			t.Errorf("serve's log does not name %s", file)
		}
		for line := range strings.Lines(string(body)) {
			if seed := strings.TrimSpace(line); strings.HasPrefix(seed, "SU") && strings.Contains(serve.output(), seed) {
				t.Errorf("serve's log holds the %s seed", role)
			}
		}
	}
	// serve names the files of the roles a person uses (the launcher's
	// and policy-admin's) and keeps its own.
	checkSeed("operator", false)
	checkSeed("launcher", true)
	checkSeed("policy-admin", true)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 3 {
		t.Errorf("serve's first start wrote %d files in %s, want the 3 roles' seeds", len(entries), dir)
	}
	seed := func(role string) string { return filepath.Join(dir, role+".nk") }

	// Anonymous clients are refused at the door, topoctl without
	// credentials too.
	if nc, err := nats.Connect(url, nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected to serve --listen 0.0.0.0")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Errorf("anonymous client: %v, want an authorization violation", err)
	}
	if r := topoctl(t, url, "submit", writeJob(t, t.TempDir(), "anon-1", 8)); r.code == 0 {
		t.Errorf("topoctl submit without credentials succeeded:\n%s", r.stdout)
	}

	op := connectWith(t, url, "operator", nkeyOption(t, seed("operator")))
	launcher := connectWith(t, url, "launcher", nkeyOption(t, seed("launcher")))
	readerCannotTouchServices(t, "launcher", url, []string{"--nkey", seed("launcher")}, launcher, op.js)
	launcherRoundTrip(t, url, childEnv(), []string{"--nats-nkey", seed("launcher")}, "open-1")
	if err := launcher.publish("toposched.placement.decided", `{"job_id":"forged","strategy":"blind","ranks":[],"nodes":[]}`); err == nil ||
		!errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("launcher publishing a decision: %v, want a permissions violation", err)
	}

	// An agent and a tenant issued while serve runs.
	issueRoles(t, dir, "--agent", "gpu-001", "--tenant", "research")
	waitServeTakesRoles(t, serve, "agent-gpu-001", "tenant-research")
	checkSeed("agent-gpu-001", false)
	agent := connectWith(t, url, "agent-gpu-001", nkeyOption(t, seed("agent-gpu-001")))
	health := func(node string) string {
		return fmt.Sprintf(`{"node":%q,"component":"gpu","id":"0","health":"healthy","observed_at":"2026-11-29T12:00:00Z"}`, node)
	}
	if err := agent.publish("toposched.topology.health.gpu-001", health("gpu-001")); err != nil {
		t.Errorf("agent-gpu-001 publishing its node's health: %v", err)
	}
	for subject, body := range map[string]string{
		"toposched.topology.health.gpu-002": health("gpu-002"),
		subjectSubmitted:                    `{"job_id":"agent-job","gpus":1}`,
	} {
		if err := agent.publish(subject, body); err == nil || !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("agent-gpu-001 publishing %s: %v, want a permissions violation", subject, err)
		}
	}
	checkSeed("tenant-research", false)
	connectWith(t, url, "tenant-research", nkeyOption(t, seed("tenant-research")))
	// The tenant's key, kept elsewhere, once its file is gone.
	kept := filepath.Join(t.TempDir(), "tenant-research.nk")
	if err := os.WriteFile(kept, []byte(seeds["tenant-research"]), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(seed("tenant-research")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nkeyOption(t, kept))
		if err == nil {
			nc.Close()
			return false, "tenant-research's key still signs in after its seed file was removed"
		}
		return errors.Is(err, nats.ErrAuthorization), fmt.Sprintf("tenant-research's removed key: %v", err)
	})
	delete(seeds, "tenant-research")

	// A restart reads the same keys back.
	serve.signal(t, syscall.SIGTERM)
	if code := serve.waitExit(t, 30*time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM", code)
	}
	start("toposched serve --listen 0.0.0.0 (restarted)")
	for role, before := range seeds {
		if after, err := os.ReadFile(seed(role)); err != nil || string(after) != before {
			t.Errorf("%s's seed file changed across a restart (%v)", role, err)
		}
	}
	connectWith(t, url, "launcher after restart", nkeyOption(t, seed("launcher")))
	connectWith(t, url, "agent-gpu-001 after restart", nkeyOption(t, seed("agent-gpu-001")))
}

// writeServiceSeeds writes an nkey seed file for each service's role into
// the credentials directory dir, as the services' deployment keeps them:
// `toposched roles issue` issues agents and tenants (and the operator,
// launcher and policy-admin), not the services.
func writeServiceSeeds(t *testing.T, dir string, services ...string) {
	t.Helper()
	for _, svc := range services {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, err := kp.Seed()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, svc+".nk"), append(seed, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// nkeyServer runs nats-server on the shipped standalone.conf with the
// users of the credentials directory dir in place of the shipped auth.conf
// (which standalone.conf includes): the real `toposched roles conf --dir`'s
// output, as deploy/README.md tells a site with agents and tenants to do.
func nkeyServer(t *testing.T, dir string) (string, *proc) {
	t.Helper()
	conf := natsConfDir(t, "standalone.conf")
	if err := os.WriteFile(filepath.Join(conf, "auth.conf"), []byte(rolesConf(t, dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	return confServer(t, conf, "nats")
}

// streamOfSubject is the stream that stores an event subject.
func streamOfSubject(subject string) string {
	domain, _, _ := strings.Cut(strings.TrimPrefix(subject, "toposched."), ".")
	return "TOPOSCHED_" + strings.ToUpper(domain)
}

// storedBody reports whether stream holds body on subject.
func storedBody(t *testing.T, js jetstream.JetStream, subject, body string) bool {
	t.Helper()
	stream := streamOfSubject(subject)
	n := storedOn(t, js, stream, subject)
	if n == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatalf("read %s on %s: %v", stream, subject, err)
	}
	for range n {
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatalf("read %s on %s: %v", stream, subject, err)
		}
		if string(m.Data()) == body {
			return true
		}
	}
	return false
}

// rolePublish is one publish a role tries.
type rolePublish struct {
	subject string
	allowed bool
}

// roleRows are the rows of the identity table (docs/security.md): what
// each role may publish and some of what it may not. Bodies are probes no
// service can read (they are dead-lettered); the nodes of the agents'
// rows are not the cluster's, so that the probes change no node that is
// placed on. Placement's term marker is only ever refused: a stored one
// would fence out the placement that runs.
var roleRows = []struct {
	role   string
	pubs   []rolePublish
	reader bool // reads the streams through ordered consumers only
}{
	{role: "operator", pubs: []rolePublish{
		{"toposched.jobs.submitted", true},
		{"toposched.placement.decided", true},
		{"toposched.topology.node.gpu-101", true},
		{"toposched.agent.heartbeat.gpu-102", true},
		{"toposched.runtime.ranks_exited.gpu-101", true},
	}},
	{role: "analysis", pubs: []rolePublish{
		{"toposched.jobs.analyzed", true},
		{"toposched.placement.rejected", true},
		{"toposched.placement.decided", false},
		{"toposched.placement.term", false},
		{"toposched.placement.released", false},
		{"toposched.jobs.submitted", false},
		{"toposched.jobs.finished", false},
		{"toposched.topology.node.gpu-101", false},
		{"toposched.runtime.tuning", false},
		{"toposched.agent.heartbeat.gpu-101", false},
	}},
	{role: "placement", pubs: []rolePublish{
		{"toposched.placement.decided", true},
		{"toposched.placement.pending", true},
		{"toposched.placement.released", true},
		{"toposched.placement.finish_refused", true},
		{"toposched.jobs.finished", true},
		{"toposched.jobs.analyzed", false},
		{"toposched.jobs.submitted", false},
		{"toposched.topology.node.gpu-101", false},
		{"toposched.runtime.tuning", false},
		{"toposched.placement.migration", false},
		{"toposched.agent.heartbeat.gpu-101", false},
		{"toposched.runtime.ranks_exited.gpu-101", false},
	}},
	{role: "optimizer", pubs: []rolePublish{
		{"toposched.placement.migration", true},
		{"toposched.runtime.tuning", true},
		{"toposched.runtime.diagnosis", true},
		{"toposched.placement.decided", false},
		{"toposched.placement.term", false},
		{"toposched.placement.released", false},
		{"toposched.jobs.analyzed", false},
		{"toposched.jobs.submitted", false},
		{"toposched.topology.node.gpu-101", false},
	}},
	{role: "discovery", pubs: []rolePublish{
		{"toposched.topology.node.gpu-101", true},
		{"toposched.topology.health.gpu-102", true},
		{"toposched.topology.fabric", true},
		{"toposched.placement.decided", false},
		{"toposched.placement.term", false},
		{"toposched.jobs.analyzed", false},
		{"toposched.jobs.submitted", false},
		{"toposched.runtime.tuning", false},
		{"toposched.agent.heartbeat.gpu-101", false},
	}},
	{role: "launcher", reader: true, pubs: []rolePublish{
		{"toposched.jobs.submitted", true},
		{"toposched.jobs.submitted.tenant.ads", true},
		{"toposched.jobs.finished", true},
		{"toposched.jobs.finished.tenant.research", true},
		{"toposched.jobs.migration_accepted", true},
		{"toposched.runtime.telemetry", true},
		{"toposched.runtime.telemetry.tenant.research", true},
		{"toposched.jobs.finished.node.gpu-101", false},
		{"toposched.runtime.telemetry.node.gpu-101", false},
		{"toposched.placement.decided", false},
		{"toposched.placement.released", false},
		{"toposched.placement.term", false},
		{"toposched.topology.node.gpu-101", false},
		{"toposched.agent.heartbeat.gpu-101", false},
		{"toposched.runtime.ranks_exited.gpu-101", false},
		{"toposched.runtime.rank_log.gpu-101", false},
		{"$KV.toposched-policies.bundle", false},
	}},
	{role: "tenant-research", reader: true, pubs: []rolePublish{
		{"toposched.jobs.submitted.tenant.research", true},
		{"toposched.jobs.finished.tenant.research", true},
		{"toposched.jobs.migration_accepted.tenant.research", true},
		{"toposched.runtime.telemetry.tenant.research", true},
		{"toposched.jobs.submitted", false},
		{"toposched.jobs.submitted.tenant.ads", false},
		{"toposched.jobs.finished", false},
		{"toposched.jobs.finished.tenant.ads", false},
		{"toposched.jobs.finished.node.gpu-101", false},
		{"toposched.runtime.telemetry", false},
		{"toposched.placement.decided", false},
		{"toposched.placement.released", false},
		{"toposched.topology.node.gpu-101", false},
		{"toposched.agent.heartbeat.gpu-101", false},
		{"toposched.runtime.ranks_exited.gpu-101", false},
		{"$KV.toposched-policies.bundle", false},
	}},
	{role: "agent-gpu-101", reader: true, pubs: []rolePublish{
		{"toposched.topology.node.gpu-101", true},
		{"toposched.topology.health.gpu-101", true},
		{"toposched.agent.heartbeat.gpu-101", true},
		{"toposched.runtime.rank_log.gpu-101", true},
		{"toposched.runtime.ranks_exited.gpu-101", true},
		{"toposched.jobs.finished.node.gpu-101", true},
		{"toposched.runtime.telemetry.node.gpu-101", true},
		{"toposched.topology.node.gpu-102", false},
		{"toposched.topology.health.gpu-102", false},
		{"toposched.agent.heartbeat.gpu-102", false},
		{"toposched.runtime.rank_log.gpu-102", false},
		{"toposched.runtime.ranks_exited.gpu-102", false},
		{"toposched.jobs.finished.node.gpu-102", false},
		{"toposched.jobs.finished", false},
		{"toposched.jobs.finished.tenant.research", false},
		{"toposched.jobs.submitted", false},
		{"toposched.jobs.submitted.tenant.research", false},
		{"toposched.runtime.telemetry", false},
		{"toposched.topology.fabric", false},
		{"toposched.placement.decided", false},
		{"toposched.placement.term", false},
	}},
	{role: "policy-admin", pubs: []rolePublish{
		{"toposched.placement.decided", false},
		{"toposched.jobs.submitted", false},
		{"toposched.jobs.finished", false},
		{"toposched.topology.node.gpu-101", false},
		{"toposched.agent.heartbeat.gpu-101", false},
	}},
}

// TestSecurityRoles checks each row of the identity table
// (docs/security.md) on the two servers toposched runs on, each with the same
// credentials directory: the nkeys of the real `toposched roles issue` (an
// agent per node, a tenant each for research and ads, and serve's three
// roles) and a seed per service:
//
//   - nats-server on the shipped standalone.conf, the users it includes
//     written by the real `toposched roles conf --dir`, with each service
//     run as its own process signed in as its own role (the Helm chart's
//     shape);
//   - `toposched serve`'s embedded server, on that directory as its data
//     dir's credentials.
//
// Each role publishes what it may (stored in its stream) and some of what
// it may not (a permissions violation, and nothing stored); the readers
// (launcher, tenants, agents) can neither touch a service's durable
// consumer nor manage a stream; the launcher and a tenant go through
// topoctl's round trip; only policy-admin pushes policies.
func TestSecurityRoles(t *testing.T) {
	needBinaries(t)
	t.Parallel()
	data := t.TempDir()
	creds := credentialsDir(data)
	issueRoles(t, creds, "--agent", "gpu-101", "--agent", "gpu-102", "--tenant", "research", "--tenant", "ads")
	writeServiceSeeds(t, creds, "analysis", "placement", "optimizer", "discovery")

	natsURL, _ := nkeyServer(t, creds)
	var services []*proc
	for _, svc := range [][]string{
		{"discovery", "--cluster", testdata(t, "two-nodes.yaml"), "--poll", "0"},
		{"analysis"}, {"placement"}, {"optimizer"},
	} {
		// Each finds its own role's seed, <service>.nk, through
		// TOPOSCHED_DATA_DIR.
		services = append(services, startProc(t, svc[0], childEnv("TOPOSCHED_DATA_DIR="+data), bins.toposched,
			append([]string{"--nats-url", natsURL}, svc...)...))
	}
	port := freePort(t)
	serve := startServe(t, "serve", testdata(t, "two-nodes.yaml"), port, data, "--poll", "0")
	serveURL := fmt.Sprintf("nats://127.0.0.1:%d", port)

	for _, srv := range []struct {
		name, url string
		procs     []*proc
	}{
		{"nats-server", natsURL, services},
		{"serve", serveURL, []*proc{serve}},
	} {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel()
			op := connectWith(t, srv.url, "operator", nkeyOption(t, seedIn(t, creds, "operator")))
			waitFor(t, 60*time.Second, func() (bool, string) {
				mustBeAlive(t, srv.procs...)
				for _, c := range serviceConsumers {
					if ok, why := consumerExists(op.js, c.stream, c.name); !ok {
						return false, why
					}
				}
				return consumerDrained(op.js, streamTopology, durablePlacementTopology, 2)
			})
			for _, row := range roleRows {
				t.Run(row.role, func(t *testing.T) {
					rc := connectWith(t, srv.url, row.role, nkeyOption(t, seedIn(t, creds, row.role)))
					for i, p := range row.pubs {
						body := fmt.Sprintf(`{"probe":"%s %s #%d"}`, srv.name, row.role, i)
						if p.allowed {
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
							ack, err := rc.js.Publish(ctx, p.subject, []byte(body))
							cancel()
							if err != nil {
								t.Errorf("%s publishing on %s: %v, want it stored", row.role, p.subject, err)
								continue
							}
							ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
							s, err := op.js.Stream(ctx, ack.Stream)
							var m *jetstream.RawStreamMsg
							if err == nil {
								m, err = s.GetMsg(ctx, ack.Sequence)
							}
							cancel()
							if err != nil || m.Subject != p.subject || string(m.Data) != body {
								t.Errorf("%s's publish on %s: %s #%d holds %v (%v), want its body", row.role, p.subject, ack.Stream, ack.Sequence, m, err)
							}
							continue
						}
						// A refused publish gets no PubAck; the violation
						// comes back at once as an async error.
						if err := rc.nc.Publish(p.subject, []byte(body)); err != nil {
							t.Fatal(err)
						}
						if err := rc.nc.Flush(); err != nil {
							t.Fatal(err)
						}
						waitFor(t, 10*time.Second, func() (bool, string) { return rc.refused(p.subject) })
						if !strings.HasPrefix(p.subject, "$") && storedBody(t, op.js, p.subject, body) {
							t.Errorf("%s's refused publish on %s is stored", row.role, p.subject)
						}
					}
					if row.reader {
						readerCannotTouchServices(t, row.role, srv.url, []string{"--nkey", seedIn(t, creds, row.role)}, rc, op.js)
					}
				})
			}

			// The launcher's and a tenant's work with topoctl, each signed
			// in with the seed it finds in TOPOSCHED_DATA_DIR.
			env := childEnv("TOPOSCHED_DATA_DIR=" + data)
			launcherRoundTrip(t, srv.url, env, nil, "roles-launcher")
			launcherRoundTrip(t, srv.url, env, []string{"--tenant", "research"}, "roles-research")
			// Policy push: refused to the launcher and a tenant, done by
			// policy-admin.
			policies := filepath.Join(moduleRoot, "policies", "default")
			for _, role := range []string{"launcher", "tenant-research"} {
				r := runCmd(t, 60*time.Second, env, bins.topoctl, "--nats-url", srv.url, "--nats-nkey", seedIn(t, creds, role),
					"policy", "push", policies, "--timeout", "5s")
				if r.code == 0 {
					t.Errorf("topoctl policy push as %s succeeded:\n%s", role, r.stdout)
				}
			}
			if r := runCmd(t, 60*time.Second, env, bins.topoctl, "--nats-url", srv.url, "policy", "push", policies); r.code != 0 {
				t.Errorf("topoctl policy push as policy-admin: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
			}
		})
	}
}
