package main

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/natsflags"
)

// serve --help: the default address is loopback, and 0.0.0.0 appears only
// where the help says it needs authentication.
func TestServeHelpListensOnLoopbackAndSaysOpenNeedsAuth(t *testing.T) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs([]string{"serve", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	serve, _, err := root.Find([]string{"serve"})
	if err != nil {
		t.Fatal(err)
	}
	host, _, err := net.SplitHostPort(serve.Flags().Lookup("listen").DefValue)
	if err != nil || !natsserver.IsLoopback(host) {
		t.Errorf("--listen defaults to %q, want a loopback address", serve.Flags().Lookup("listen").DefValue)
	}
	help := out.String()
	lines := strings.Split(help, "\n")
	for i, line := range lines {
		if !strings.Contains(line, "0.0.0.0") {
			continue
		}
		// The line, the comment above an example, or the sentence's next
		// line says so.
		context := line
		if i > 0 {
			context = lines[i-1] + "\n" + context
		}
		if i+1 < len(lines) {
			context += "\n" + lines[i+1]
		}
		if !strings.Contains(context, "authenticat") && !strings.Contains(context, "credentials") {
			t.Errorf("serve --help suggests 0.0.0.0 without saying it needs authentication:\n%s", context)
		}
	}
	if !strings.Contains(help, "--nats-config") {
		t.Errorf("serve --help does not offer --nats-config:\n%s", help)
	}
}

// The embedded server of serve, on its default address, listens on
// loopback, and even there lets in only the users of its credentials
// directory (issue 46: anyone on the host was root on every exec agent):
// a client without credentials is refused, the operator's seed signs in,
// and a seed issued while it runs (toposched roles issue) signs in within
// a poll, a removed one no more.
func TestServeDefaultListenIsLoopbackAndSecure(t *testing.T) {
	host, _, err := net.SplitHostPort(defaultListen)
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	ctx := t.Context()
	conn, err := startEmbedded(ctx, embeddedFlags{listen: net.JoinHostPort(host, "-1"), dataDir: dataDir, prefix: "toposched"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.srv.Shutdown()
	if a := conn.srv.Addr(); !a.IP.IsLoopback() {
		t.Errorf("serve's embedded server listens on %v, want loopback", a)
	}
	if conn.opts == nil || !conn.srv.RequiresAuth() {
		t.Fatalf("loopback: credentials %v, requires auth %v; want both", conn.opts, conn.srv.RequiresAuth())
	}
	if nc, err := nats.Connect(conn.url); err == nil {
		nc.Close()
		t.Fatal("a client without credentials signed in on loopback")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous client: %v, want an authorization violation", err)
	}
	dir := natsflags.CredentialsDir(dataDir)
	signIn := func(role string) error {
		opt, err := nats.NkeyOptionFromSeed(filepath.Join(dir, role+natsserver.SeedFileSuffix))
		if err != nil {
			return err
		}
		nc, err := nats.Connect(conn.url, opt)
		if err == nil {
			nc.Close()
		}
		return err
	}
	for _, role := range []string{roleOperator, roleLauncher, rolePolicyAdmin} {
		if err := signIn(role); err != nil {
			t.Errorf("%s: %v", role, err)
		}
	}
	wanted, err := issuedRoles("toposched", []string{"gpu-001"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsserver.EnsureCredentials(dir, wanted); err != nil {
		t.Fatal(err)
	}
	until := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * credentialsPoll); !ok(); time.Sleep(credentialsPoll / 10) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	until("an agent issued while serve runs does not sign in", func() bool { return signIn("agent-gpu-001") == nil })
	seed, err := os.ReadFile(filepath.Join(dir, "agent-gpu-001.nk"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "agent-gpu-001.nk")); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(t.TempDir(), "kept.nk")
	if err := os.WriteFile(kept, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	until("a removed agent's seed still signs in", func() bool {
		opt, err := nats.NkeyOptionFromSeed(kept)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(conn.url, opt)
		if err == nil {
			nc.Close()
		}
		return errors.Is(err, nats.ErrAuthorization)
	})
}

// --insecure-loopback opens the loopback listener, and nothing else.
func TestServeInsecureLoopback(t *testing.T) {
	conn, err := startEmbedded(t.Context(), embeddedFlags{listen: "127.0.0.1:-1", dataDir: t.TempDir(), prefix: "toposched", insecure: true}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.srv.Shutdown()
	if conn.opts != nil || conn.srv.RequiresAuth() {
		t.Errorf("--insecure-loopback: credentials %v, requires auth %v; want none", conn.opts, conn.srv.RequiresAuth())
	}
	_, err = startEmbedded(t.Context(), embeddedFlags{listen: "0.0.0.0:-1", dataDir: t.TempDir(), prefix: "toposched", insecure: true}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--insecure-loopback") {
		t.Fatalf("--insecure-loopback on 0.0.0.0: %v, want a refusal naming the flag", err)
	}
}

// Beyond loopback with a NATS config that has no users, serve refuses to
// start and says what to do.
func TestServeRefusesOpenListenWithoutAuth(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("max_payload: 8MB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := startEmbedded(t.Context(), embeddedFlags{listen: "0.0.0.0:-1", dataDir: t.TempDir(), config: conf, prefix: "toposched"}, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("serve started on 0.0.0.0 with a config without users")
	}
	for _, want := range []string{"--nats-config", conf, "0.0.0.0", "users", "127.0.0.1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// The placement and optimizer services and serve take --compute-reference, and a model
// the speed table does not know is refused, naming the flag's field,
// before any connection is tried (the NATS URL here answers nothing).
func TestComputeReferenceFlagRefusedFirst(t *testing.T) {
	for _, args := range [][]string{
		{"placement", "--compute-reference", "nosuch", "--nats-url", "nats://127.0.0.1:1"},
		{"optimizer", "--compute-reference", "nosuch", "--nats-url", "nats://127.0.0.1:1"},
		{"serve", "--compute-reference", "nosuch", "--nats-url", "nats://127.0.0.1:1", "--cluster", "no-such-file.yaml"},
	} {
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), `compute reference "nosuch"`) || strings.Contains(err.Error(), "connect") {
			t.Errorf("%v: %v, want the compute reference refused before connecting", args, err)
		}
	}
}
