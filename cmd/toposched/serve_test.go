package main

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/events/natsserver"
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
// loopback and needs no credentials there.
func TestServeDefaultListenIsLoopback(t *testing.T) {
	host, _, err := net.SplitHostPort(defaultListen)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := startEmbedded(embeddedFlags{listen: net.JoinHostPort(host, "-1"), dataDir: t.TempDir(), prefix: "toposched"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.srv.Shutdown()
	if a := conn.srv.Addr(); !a.IP.IsLoopback() {
		t.Errorf("serve's embedded server listens on %v, want loopback", a)
	}
	if conn.opts != nil || conn.srv.RequiresAuth() {
		t.Errorf("loopback: credentials %v, requires auth %v; want none", conn.opts, conn.srv.RequiresAuth())
	}
}

// Beyond loopback with a NATS config that has no users, serve refuses to
// start and says what to do.
func TestServeRefusesOpenListenWithoutAuth(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("max_payload: 8MB\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := startEmbedded(embeddedFlags{listen: "0.0.0.0:-1", dataDir: t.TempDir(), config: conf, prefix: "toposched"}, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("serve started on 0.0.0.0 with a config without users")
	}
	for _, want := range []string{"--nats-config", conf, "0.0.0.0", "users", "127.0.0.1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}
