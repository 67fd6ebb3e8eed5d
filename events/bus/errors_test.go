package bus

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestRetryableJS(t *testing.T) {
	t.Parallel()
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("create stream: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc})
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"nats timeout", nats.ErrTimeout, true},
		{"no responders", fmt.Errorf("x: %w", nats.ErrNoResponders), true},
		{"no stream response", jetstream.ErrNoStreamResponse, true},
		{"reconnecting", nats.ErrConnectionReconnecting, true},
		{"cluster not available", api(503, 10008, "JetStream system temporarily unavailable"), true},
		{"jetstream not enabled", jetstream.ErrJetStreamNotEnabled, true},
		{"request timeout", api(408, 0, "request timeout"), true},
		{"replicas not supported yet", api(500, errCodeReplicasNotSupported, "replicas > 1 not supported in non-clustered mode"), true},
		{"stream not found", jetstream.ErrStreamNotFound, false},
		{"name in use", jetstream.ErrStreamNameAlreadyInUse, false},
		{"bad request", api(400, jetstream.JSErrCodeBadRequest, "bad request"), false},
		{"cancelled", context.Canceled, false},
		{"other", errors.New("temporarily unavailable"), false},
	}
	for _, tc := range tests {
		if got := retryableJS(tc.err); got != tc.want {
			t.Errorf("%s: retryableJS(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestRetryJetStreamUsesTransport(t *testing.T) {
	t.Parallel()
	tr := Transport{SetupRetryFor: 50 * time.Millisecond, SetupRetryInitial: time.Millisecond, SetupRetryMax: 2 * time.Millisecond}.withDefaults()
	n := 0
	err := retryJetStream(context.Background(), tr, func(context.Context) error { n++; return nats.ErrTimeout })
	if !errors.Is(err, nats.ErrTimeout) || n < 2 {
		t.Errorf("retryJetStream = %v after %d attempts, want a timeout after several", err, n)
	}
	n = 0
	err = retryJetStream(context.Background(), tr, func(context.Context) error { n++; return jetstream.ErrStreamNotFound })
	if !errors.Is(err, jetstream.ErrStreamNotFound) || n != 1 {
		t.Errorf("permanent error: %v after %d attempts, want 1", err, n)
	}
}

// Only a "wrong last sequence" that says the sequence it found is a newer
// term's marker; the one without (10164: a clustered stream still storing
// another write fenced on the same marker) refuses nothing for good, and
// neither ends a term nor is dead-lettered.
func TestFencedOrInProcess(t *testing.T) {
	t.Parallel()
	api := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: 400, ErrorCode: code, Description: "wrong last sequence"})
	}
	for _, tc := range []struct {
		name              string
		err               error
		fenced, inProcess bool
	}{
		{"a newer marker", api(jetstream.JSErrCodeStreamWrongLastSequence), true, false},
		{"another fenced write being stored", api(jetstream.JSErrCodeStreamWrongLastSequenceConstant), false, true},
		{"the same message being stored", api(errCodeDuplicateInProcess), false, true},
		{"another API error", api(jetstream.JSErrCodeStreamNotFound), false, false},
		{"no API error", errors.New("timeout"), false, false},
	} {
		if got := fenced(tc.err); got != tc.fenced {
			t.Errorf("%s: fenced %v, want %v", tc.name, got, tc.fenced)
		}
		if got := inProcess(tc.err); got != tc.inProcess {
			t.Errorf("%s: in process %v, want %v", tc.name, got, tc.inProcess)
		}
	}
	b := &Bus{}
	err := b.publishError(nats.NewMsg("s"), api(jetstream.JSErrCodeStreamWrongLastSequenceConstant))
	if errors.Is(err, ErrFenced) || !errors.Is(err, ErrUnconfirmed) || !IsTransient(err) {
		t.Errorf("10164 published as %v: want unconfirmed and transient, not fenced", err)
	}
}

// Every answer JetStream gives a message it has no room for reads
// "JetStream storage full", the account's limit included: the embedded
// server lowers that one when its disk has less room than its own limit.
func TestStorageFull(t *testing.T) {
	t.Parallel()
	api := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("publish: %w", &jetstream.APIError{Code: 503, ErrorCode: code, Description: "no room"})
	}
	for _, tc := range []struct {
		name string
		err  error
		full bool
	}{
		{"the server's limit", api(errCodeInsufficientResources), true},
		{"insufficient storage resources", api(errCodeStorageExceeded), true},
		{"the account's limit", api(errCodeAccountExceeded), true},
		{"another API error", api(jetstream.JSErrCodeStreamNotFound), false},
		{"no API error", errors.New("timeout"), false},
	} {
		if got := storageFull(tc.err); got != tc.full {
			t.Errorf("%s: storage full %v, want %v", tc.name, got, tc.full)
		}
		err := (&Bus{}).publishError(nats.NewMsg("s"), tc.err)
		if got := errors.Is(err, ErrStorageFull); got != tc.full || !IsTransient(err) {
			t.Errorf("%s: published as %v (transient %v)", tc.name, err, IsTransient(err))
		}
	}
}
