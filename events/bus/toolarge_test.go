package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

func TestTooLarge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"client max_payload", fmt.Errorf("publish: %w", nats.ErrMaxPayload), true},
		{"stream max_msg_size", fmt.Errorf("publish: %w", &jetstream.APIError{Code: 400, ErrorCode: errCodeMessageTooLarge,
			Description: "message size exceeds maximum allowed"}), true},
		{"nats.go's sentinel", jetstream.ErrStreamMessageExceedsMaximum, true},
		{"described", &TooLargeError{Subject: "s", Size: 2, Limit: 1, Err: nats.ErrMaxPayload}, true},
		{"timeout", nats.ErrTimeout, false},
		{"other 400", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeBadRequest, Description: "message size exceeds maximum allowed"}, false},
		{"words only", errors.New("maximum payload exceeded"), false},
	}
	for _, tc := range tests {
		if got := TooLarge(tc.err); got != tc.want {
			t.Errorf("%s: TooLarge(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// TestStreamRefusesTooLarge: on a server whose max_payload is above the
// streams' max_msg_size, the stream's refusal is a *TooLargeError naming
// the stream's limit, not a Transient error.
func TestStreamRefusesTooLarge(t *testing.T) {
	t.Parallel()
	ns := jetStreamServer(t, &server.Options{MaxPayload: 16 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := Connect(ctx, Config{URL: ns.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	body := []byte(`{"job_id":"big","gpus":1,"tenant":"` + strings.Repeat("x", 9<<20) + `"}`)
	err = b.PublishRaw(ctx, b.Subjects.Prefix+".jobs.submitted", nil, body)
	var tl *TooLargeError
	if !errors.As(err, &tl) || IsTransient(err) || tl.Limit != streamMaxMsgSize || tl.Size < len(body) {
		t.Fatalf("publish of %d bytes: %v (%T), want a *TooLargeError at the stream's limit %d", len(body), err, err, streamMaxMsgSize)
	}
}

// The streams' limit is the one the services bound their events by.
func TestStreamLimitIsTheMessageLimit(t *testing.T) {
	t.Parallel()
	if streamMaxMsgSize != events.MaxMessageBytes {
		t.Fatalf("streams take %d bytes, events.MaxMessageBytes is %d", streamMaxMsgSize, events.MaxMessageBytes)
	}
}

// jetStreamServer runs a JetStream server on a loopback port with opts
// (Host, Port, the store and the limits set here) until the test ends.
func jetStreamServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true, true
	opts.JetStreamMaxMemory, opts.JetStreamMaxStore = 64<<20, 1<<30
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	return ns
}
