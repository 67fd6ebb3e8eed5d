package kvwatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/events/kvwatch"
)

// testSet is the set the tests follow: a JSON object whose n may not be
// negative.
type testSet struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

func decodeTestSet(_ context.Context, bucket string, v *kvwatch.Value[testSet]) {
	v.Revision = string(v.Raw)
	var s testSet
	if err := json.Unmarshal(v.Raw, &s); err != nil {
		v.Err = fmt.Errorf("%s@%d: %w", bucket, v.KVRevision, err)
		return
	}
	v.Name = s.Name
	if s.N < 0 {
		v.Err = fmt.Errorf("%s@%d: n is %d, below 0", bucket, v.KVRevision, s.N)
		return
	}
	v.Set = &s
}

// owner applies the set as the operator's loops do: the pushed set is in
// force, the base when none is; a refusal leaves what is in force.
type owner struct {
	mu      sync.Mutex
	inForce string
	calls   chan string
}

func newOwner() *owner { return &owner{inForce: "base", calls: make(chan string, 64)} }

func (o *owner) Offer(_ context.Context, trigger string, v kvwatch.Value[testSet]) {
	o.inForce = v.Set.Name
	o.calls <- "offer " + trigger + " " + v.Set.Name
}

func (o *owner) Withdraw(_ context.Context, trigger string, v kvwatch.Value[testSet]) {
	if !v.Deleted {
		panic("Withdraw of a value that is not a deletion")
	}
	o.inForce = "base"
	o.calls <- "withdraw " + trigger
}

func (o *owner) Refuse(_ context.Context, trigger string, v kvwatch.Value[testSet]) {
	if v.Err == nil || v.Set != nil {
		panic("Refuse of a valid set")
	}
	o.calls <- "refuse " + trigger + " " + v.Name
}

func (o *owner) force() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.inForce
}

// next is the owner's next call, failing the test when none comes.
func (o *owner) next(t *testing.T, ctx context.Context) string {
	t.Helper()
	select {
	case c := <-o.calls:
		return c
	case <-ctx.Done():
		t.Fatal("no call to the handler")
	}
	return ""
}

// none checks that nothing was handed over that the test has not read.
func (o *owner) none(t *testing.T) {
	t.Helper()
	select {
	case c := <-o.calls:
		t.Fatalf("unexpected call %q", c)
	default:
	}
}

func bucket(t *testing.T, ctx context.Context) jetstream.KeyValue {
	t.Helper()
	srv := eventstest.Server(t)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := kvwatch.Open(ctx, js, jetstream.KeyValueConfig{Bucket: kvwatch.BucketName("", "tests"), History: 8})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func put(t *testing.T, ctx context.Context, kv jetstream.KeyValue, value string) uint64 {
	t.Helper()
	rev, err := kv.Put(ctx, "set", []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// start starts a Follower of kv's key "set" for o, stopped when the test
// ends, and returns it once the value in force was handed over.
func start(t *testing.T, ctx context.Context, kv jetstream.KeyValue, o *owner, log *slog.Logger) *kvwatch.Follower[testSet] {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	f := &kvwatch.Follower[testSet]{KV: kv, Key: "set", Decode: decodeTestSet, Lock: &o.mu, Handler: o, Log: log}
	if err := f.Start(ctx, runCtx, &wg); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return f
}

func TestBucketName(t *testing.T) {
	for _, tc := range []struct{ prefix, kind, want string }{
		{"", "policies", "toposched-policies"},
		{"acme-prod", "calibration", "acme-prod-calibration"},
		{"a$b.c", "policies", "a_b_c-policies"},
	} {
		if got := kvwatch.BucketName(tc.prefix, tc.kind); got != tc.want {
			t.Errorf("BucketName(%q, %q) = %q, want %q", tc.prefix, tc.kind, got, tc.want)
		}
	}
}

// Each entry reaches the handler once, in order: a valid set is offered,
// a bad one refused with the set in force kept, a deletion withdraws the
// set offered, and a deletion with none offered is not handed over.
func TestFollower(t *testing.T) {
	ctx := eventstest.Context(t, 30*time.Second)
	kv := bucket(t, ctx)
	put(t, ctx, kv, `{"name":"a","n":1}`)
	o := newOwner()
	f := start(t, ctx, kv, o, slog.New(slog.DiscardHandler))
	// Start returns once the value in force is handed over.
	if c := o.next(t, ctx); c != "offer kv@1 a" {
		t.Fatalf("first call %q, want the value in force offered", c)
	}
	o.mu.Lock()
	if f.LastKV() != 1 {
		t.Errorf("LastKV %d after the first entry, want 1", f.LastKV())
	}
	o.mu.Unlock()

	for _, step := range []struct {
		name, value   string // value "" deletes the key
		want, inForce string
	}{
		{"not json", `{"name":`, "refuse kv@2 ", "a"},
		{"invalid set", `{"name":"b","n":-1}`, "refuse kv@3 b", "a"},
		{"valid set", `{"name":"c","n":2}`, "offer kv@4 c", "c"},
		{"deleted", "", "withdraw kv@5", "base"},
		// A second deletion has nothing to withdraw: the next call is
		// the put after it.
		{"deleted again", "", "", "base"},
		{"valid after", `{"name":"d","n":3}`, "offer kv@7 d", "d"},
		{"refused after", `[]`, "refuse kv@8 ", "d"},
	} {
		if step.value == "" {
			if err := kv.Delete(ctx, "set"); err != nil {
				t.Fatal(err)
			}
		} else {
			put(t, ctx, kv, step.value)
		}
		if step.want == "" {
			continue
		}
		if c := o.next(t, ctx); c != step.want {
			t.Fatalf("%s: call %q, want %q", step.name, c, step.want)
		}
		if got := o.force(); got != step.inForce {
			t.Errorf("%s: %s in force, want %s", step.name, got, step.inForce)
		}
	}
	o.none(t)
	o.mu.Lock()
	if f.LastKV() != 8 {
		t.Errorf("LastKV %d, want 8: refusals count", f.LastKV())
	}
	o.mu.Unlock()
}

// A replica that starts again is handed the latest entry first, whatever
// it is: a refused value, then what follows.
func TestFollowerReplaysTheValueInForce(t *testing.T) {
	ctx := eventstest.Context(t, 30*time.Second)
	kv := bucket(t, ctx)
	put(t, ctx, kv, `{"name":"a","n":1}`)
	put(t, ctx, kv, `{"name":"b","n":-1}`)

	o := newOwner()
	start(t, ctx, kv, o, slog.New(slog.DiscardHandler))
	if c := o.next(t, ctx); c != "refuse kv@2 b" {
		t.Fatalf("first call %q, want the latest entry refused", c)
	}
	if got := o.force(); got != "base" {
		t.Errorf("%s in force after a refused start, want base", got)
	}
	put(t, ctx, kv, `{"name":"c","n":1}`)
	if c := o.next(t, ctx); c != "offer kv@3 c" {
		t.Fatalf("call %q, want c offered", c)
	}
	o.none(t)

	// With nothing in the bucket, Start returns at once and nothing is
	// handed over; a deletion as the latest entry withdraws nothing.
	if err := kv.Delete(ctx, "set"); err != nil {
		t.Fatal(err)
	}
	again := newOwner()
	start(t, ctx, kv, again, slog.New(slog.DiscardHandler))
	put(t, ctx, kv, `{"name":"e","n":1}`)
	if c := again.next(t, ctx); c != "offer kv@5 e" {
		t.Fatalf("call %q after a start on a deletion, want e offered", c)
	}
}

// A watch that stops on its own is logged and started again; the restarted
// watch replays the value in force, which is not handed over twice.
func TestFollowerRestartsTheWatch(t *testing.T) {
	ctx := eventstest.Context(t, 30*time.Second)
	kv := &cuttable{KeyValue: bucket(t, ctx), watches: make(chan *cutWatcher, 4)}
	put(t, ctx, kv, `{"name":"a","n":1}`)
	var logs lockedBuffer
	o := newOwner()
	start(t, ctx, kv, o, slog.New(slog.NewTextHandler(&logs, nil)))
	if c := o.next(t, ctx); c != "offer kv@1 a" {
		t.Fatalf("first call %q", c)
	}
	first := kv.watch(t, ctx)
	put(t, ctx, kv, `{"name":"b","n":-2}`)
	if c := o.next(t, ctx); c != "refuse kv@2 b" {
		t.Fatalf("call %q, want b refused", c)
	}

	first.cut()
	kv.watch(t, ctx) // the restart
	if !strings.Contains(logs.String(), `msg="bucket watch stopped; restarting" err="watch bucket toposched-tests: watcher stopped"`) {
		t.Errorf("log %q lacks the restart", logs.String())
	}
	// The restarted watch hands kv@2 again before kv@3: had it reached
	// the handler, it would be the next call.
	put(t, ctx, kv, `{"name":"c","n":1}`)
	if c := o.next(t, ctx); c != "offer kv@3 c" {
		t.Fatalf("call %q after the restart, want c offered (kv@2 handed over once)", c)
	}
	o.none(t)
}

// Start fails with the first watch's error.
func TestFollowerStartFails(t *testing.T) {
	ctx := eventstest.Context(t, 30*time.Second)
	kv := &cuttable{KeyValue: bucket(t, ctx), watches: make(chan *cutWatcher, 4), fail: errors.New("no watch today")}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	o := newOwner()
	f := &kvwatch.Follower[testSet]{KV: kv, Key: "set", Decode: decodeTestSet, Lock: &o.mu, Handler: o,
		Log: slog.New(slog.DiscardHandler)}
	err := f.Start(ctx, runCtx, &wg)
	if !errors.Is(err, kv.fail) || !strings.Contains(err.Error(), "watch bucket toposched-tests") {
		t.Fatalf("Start = %v, want the watch's error naming the bucket", err)
	}
}

// cuttable is a bucket whose watches a test can stop, as a server going
// away stops them.
type cuttable struct {
	jetstream.KeyValue
	watches chan *cutWatcher
	fail    error
}

func (c *cuttable) Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	if c.fail != nil {
		return nil, c.fail
	}
	w, err := c.KeyValue.Watch(ctx, keys, opts...)
	if err != nil {
		return nil, err
	}
	cw := &cutWatcher{w: w, updates: make(chan jetstream.KeyValueEntry), stop: make(chan struct{})}
	go cw.forward()
	c.watches <- cw
	return cw, nil
}

// watch is the next watch the Follower started.
func (c *cuttable) watch(t *testing.T, ctx context.Context) *cutWatcher {
	t.Helper()
	select {
	case w := <-c.watches:
		return w
	case <-ctx.Done():
		t.Fatal("no watch started")
	}
	return nil
}

type cutWatcher struct {
	w       jetstream.KeyWatcher
	updates chan jetstream.KeyValueEntry
	stop    chan struct{}
	once    sync.Once
}

// forward passes the watch's updates on until it is cut or stopped, then
// closes its own channel as a watcher that stopped does.
func (w *cutWatcher) forward() {
	defer close(w.updates)
	for {
		select {
		case <-w.stop:
			return
		case e, ok := <-w.w.Updates():
			if !ok {
				return
			}
			select {
			case w.updates <- e:
			case <-w.stop:
				return
			}
		}
	}
}

func (w *cutWatcher) cut() { w.once.Do(func() { close(w.stop) }) }

func (w *cutWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }

func (w *cutWatcher) Stop() error {
	w.cut()
	return w.w.Stop()
}

// lockedBuffer is a log sink the Follower's goroutine writes while the
// test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
