package bus

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// A server whose JetStream API finds no responder, request after request,
// is left for another server of the connection's list, and the request
// that was failing there succeeds. (A survivor of a node's death answered
// the cluster e2e's JetStream requests so for two minutes while the other
// survivor served.) The JetStream API is stood in for by a request that
// has a responder on one server only.
func TestNoRespondersMovesToAnotherServer(t *testing.T) {
	t.Parallel()
	start := func() *server.Server {
		t.Helper()
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		t.Cleanup(s.Shutdown)
		return s
	}
	stuck, serving := start(), start()
	responder, err := nats.Connect(serving.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(responder.Close)
	if _, err := responder.Subscribe("api.probe", func(m *nats.Msg) { _ = m.Respond([]byte("ok")) }); err != nil {
		t.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	// The stuck server first, always.
	nc, err := nats.Connect(stuck.ClientURL()+","+serving.ClientURL(), nats.DontRandomize(), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	b := &Bus{nc: nc, log: slog.New(slog.DiscardHandler), cfg: Config{Transport: DefaultTransport()}}
	b.cfg.Transport.SetupRetryInitial, b.cfg.Transport.SetupRetryMax = 50*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var first error
	calls := 0
	err = b.retryJetStream(ctx, func(ctx context.Context) error {
		_, err := nc.RequestWithContext(ctx, "api.probe", nil)
		if calls++; calls == 1 {
			first = err
		}
		return err
	})
	if !errors.Is(first, nats.ErrNoResponders) {
		t.Fatalf("the first request got %v, want no responders", first)
	}
	if err != nil {
		t.Fatalf("still failing after %d requests: %v", calls, err)
	}
	if nc.ConnectedUrl() != serving.ClientURL() {
		t.Fatalf("connected to %s, want %s", nc.ConnectedUrl(), serving.ClientURL())
	}
}
