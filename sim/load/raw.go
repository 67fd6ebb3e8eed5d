package load

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

// Raw is JetStream's own publish rate on a server: what the messaging
// layer allows, so that a decision rate measured beside it compares
// across machines (as a share of it).
type Raw struct {
	Messages, Bytes int
	// AsyncPerSecond publishes with up to AsyncWindow acknowledgements
	// outstanding; SyncPerSecond waits for each.
	AsyncPerSecond, SyncPerSecond float64
}

// AsyncWindow is the raw measurement's acknowledgements outstanding at
// once (nats bench's default for js pub async).
const AsyncWindow = 256

// rawStallWait bounds how long an asynchronous publish of the raw
// measurement waits for a place in the window.
const rawStallWait = time.Minute

// MeasureRaw publishes n job-sized messages to a scratch file-backed
// stream on the server at url, asynchronously and then n/4 synchronously,
// and deletes the stream.
func MeasureRaw(ctx context.Context, url string, n int) (Raw, error) {
	nc, err := nats.Connect(url, nats.Name("toposched load: raw publish"))
	if err != nil {
		return Raw{}, fmt.Errorf("raw publish: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(AsyncWindow))
	if err != nil {
		return Raw{}, err
	}
	const name = "LOADRAW"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"loadraw.>"}, Storage: jetstream.FileStorage}); err != nil {
		return Raw{}, fmt.Errorf("raw publish: stream: %w", err)
	}
	defer func() { _ = js.DeleteStream(context.WithoutCancel(ctx), name) }() // scratch; the server goes with the run
	// A job as users submit one (a 7B model, TP 8): larger than the load
	// run's own jobs, so the raw rate does not flatter the messaging layer.
	body, err := json.Marshal(events.JobSubmitted{JobID: "load-000000", GPUs: 8, Parallelism: &events.Parallelism{TP: 8, DP: 1, PP: 1},
		Model: &events.Model{Parameters: 7e9, Layers: 32, HiddenSize: 4096, Heads: 32, SeqLen: 4096, MicroBatchSize: 1, GlobalBatchSize: 512, Dtype: "bf16"}})
	if err != nil {
		return Raw{}, err
	}
	r := Raw{Messages: n, Bytes: len(body)}
	start := time.Now()
	for i := range n {
		// A publish at the window waits for an acknowledgement to free a
		// place: that is the window, not a fault, however slow the
		// machine (nats.go gives up after 200 ms by default, which a busy
		// two-core machine exceeds).
		if _, err := js.PublishAsync(fmt.Sprintf("loadraw.%d", i%64), body, jetstream.WithStallWait(rawStallWait)); err != nil {
			return r, fmt.Errorf("raw publish: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return r, ctx.Err()
	}
	r.AsyncPerSecond = float64(n) / time.Since(start).Seconds()
	m := max(n/4, 1)
	start = time.Now()
	for i := range m {
		if _, err := js.Publish(ctx, fmt.Sprintf("loadraw.%d", i%64), body); err != nil {
			return r, fmt.Errorf("raw publish: %w", err)
		}
	}
	r.SyncPerSecond = float64(m) / time.Since(start).Seconds()
	return r, nil
}
