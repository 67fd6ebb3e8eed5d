package bus_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

// A body near max_payload (8 MiB on the embedded server, as serve runs
// it) that breaks its schema is answered once and dead-lettered once, and
// its message is acked: its dead letter, body and error header together,
// would be over the limit, so it keeps the body's first bytes, its size
// and its SHA-256 (issue 46: the copy was refused, and the message
// redelivered every few seconds for ever). Headers a publisher sent up to
// the server's 64 KiB are dropped the same way, keeping the envelope's.
func TestDeadLetterOfANearLimitBody(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		headers map[string]string
		body    string
		whole   bool // the body fits beside the headers kept
	}{
		{"body", nil, `{"job_id":"j-big","status":"succeeded","message":"` + strings.Repeat("m", 8<<20-1<<10) + `"}`, false},
		{"headers", notes(20, 3000),
			`{"job_id":"j-header","status":"succeeded","message":"` + strings.Repeat("m", 8<<20-64<<10) + `"}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var invalid atomic.Int32
			h := start(t, ok, func(context.Context, events.Envelope, []byte, error) error { invalid.Add(1); return nil })
			h.raw(t, "toposched.jobs.finished", tc.headers, tc.body)
			m := h.deadLetter(t)
			hd := m.Headers()
			sum := sha256.Sum256([]byte(tc.body))
			switch {
			case tc.whole:
				if string(m.Data()) != tc.body || hd.Get(events.HeaderDeadSize) != "" {
					t.Errorf("dead letter body of %d bytes (%s %q), want the body whole", len(m.Data()),
						events.HeaderDeadSize, hd.Get(events.HeaderDeadSize))
				}
			default:
				if size := hd.Get(events.HeaderDeadSize); size != strconv.Itoa(len(tc.body)) {
					t.Errorf("%s %q, want %d", events.HeaderDeadSize, size, len(tc.body))
				}
				if got := hd.Get(events.HeaderDeadSHA256); got != hex.EncodeToString(sum[:]) {
					t.Errorf("%s %q, want the body's", events.HeaderDeadSHA256, got)
				}
				if len(m.Data()) == 0 || len(m.Data()) > 4<<10 || !strings.HasPrefix(tc.body, string(m.Data())) {
					t.Errorf("dead letter body of %d bytes, want the body's first bytes", len(m.Data()))
				}
			}
			if e := hd.Get(events.HeaderError); !strings.Contains(e, "message") {
				t.Errorf("error header %q does not name the field", e)
			}
			if n := len(hd.Get("x-note-0")); n > 0 {
				t.Errorf("header x-note-0 of %d bytes kept beside %d bytes of headers", n, len(hd))
			}
			// Acked: nothing left to deliver, nothing redelivered.
			ctx := eventstest.Context(t, 20*time.Second)
			var info *jetstream.ConsumerInfo
			for {
				c, err := h.b.JetStream().Consumer(ctx, h.b.StreamName(events.DomainJobs), "test-finished")
				if err == nil {
					info, err = c.Info(ctx)
				}
				if err == nil && info.NumAckPending == 0 && info.AckFloor.Stream >= 1 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("the message is not acked: %+v, %v", info, err)
				case <-time.After(20 * time.Millisecond):
				}
			}
			if info.NumRedelivered != 0 || invalid.Load() != 1 {
				t.Errorf("redelivered %d, answered %d times; want 0 and 1", info.NumRedelivered, invalid.Load())
			}
			s, err := h.b.JetStream().Stream(ctx, h.b.StreamName(events.DomainDLQ))
			if err != nil {
				t.Fatal(err)
			}
			if n := s.CachedInfo().State.Msgs; n != 1 {
				t.Errorf("%d dead letters, want 1", n)
			}
		})
	}
}

// notes are n headers of size bytes each.
func notes(n, size int) map[string]string {
	h := map[string]string{}
	for i := range n {
		h["x-note-"+strconv.Itoa(i)] = strings.Repeat("h", size)
	}
	return h
}

// The reasons of an answer are bounded whatever the body held: an
// unknown property named with a megabyte, a value quoted in full.
func TestReasonsOfAreClipped(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 1<<20)
	err := fmt.Errorf("decode: %w", &events.DecodeError{Problems: []events.DecodeProblem{
		{Field: long, Code: events.DecodeUnknownField, Message: long + " is not a known field"}}})
	rs := bus.ReasonsOf(err)
	if len(rs) != 1 || len(rs[0].Field) > 1<<10+len("…") || len(rs[0].Message) > 4<<10+len("…") ||
		!strings.HasSuffix(rs[0].Field, "…") || !strings.HasPrefix(rs[0].Field, "éé") {
		t.Fatalf("reasons of %d bytes of field, %d of message", len(rs[0].Field), len(rs[0].Message))
	}
	if errors.Unwrap(err) == nil {
		t.Fatal("unreachable")
	}
}
