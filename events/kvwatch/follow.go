package kvwatch

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Handler applies what a Follower hands over, with the Follower's Lock
// held. trigger names the entry ("kv@<entry revision>"), the same on every
// replica, for the ids of the events the handler publishes.
type Handler[T any] interface {
	// Offer takes a valid set.
	Offer(ctx context.Context, trigger string, v Value[T])
	// Withdraw takes the withdrawal of the set last offered. A withdrawal
	// when none is offered (never pushed, or withdrawn already) is not
	// handed over.
	Withdraw(ctx context.Context, trigger string, v Value[T])
	// Refuse takes a value that is not a valid set: what the handler has
	// in force stays, and the set last offered stays offered.
	Refuse(ctx context.Context, trigger string, v Value[T])
}

// Follower follows the set under one key of a bucket for the component
// that applies it (the operator's policy and calibration loops): each
// entry reaches the Handler once and in order, though a restarted watch
// replays from the value in force.
type Follower[T any] struct {
	KV     jetstream.KeyValue
	Key    string
	Decode Decoder[T]
	// Lock is held while a value is handed to Handler and guards what
	// LastKV reads. It is the handler's own lock, so that what the
	// handler keeps and the entries handed over change together.
	Lock    sync.Locker
	Handler Handler[T]
	// Log reports a watch that stopped on its own.
	Log *slog.Logger

	lastKV  uint64 // the last entry handed over
	offered bool   // a set was offered and not withdrawn since
}

// restartAfter is how long a watch that stopped on its own waits before it
// starts again: long enough not to spin on a server that is going away.
const restartAfter = time.Second

// Start watches the key until runCtx ends, again a second after the watch
// stops on its own, and returns once the value in force has been handed
// over, or with the first watch's error, or when ctx ends first. Its
// goroutine is counted in wg.
func (f *Follower[T]) Start(ctx, runCtx context.Context, wg *sync.WaitGroup) error {
	ready := make(chan struct{})
	var readyOnce sync.Once
	errc := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			err := Watch(runCtx, f.KV, f.Key, f.Decode, func() { readyOnce.Do(func() { close(ready) }) },
				func(v Value[T]) { f.take(runCtx, v) })
			if err == nil || runCtx.Err() != nil {
				return
			}
			select {
			case errc <- err: // start-up is waiting for it
			default:
			}
			f.Log.Error("bucket watch stopped; restarting", "err", err)
			select {
			case <-runCtx.Done():
				return
			case <-time.After(restartAfter):
			}
		}
	}()
	select {
	case <-ready:
		return nil
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// LastKV is the revision of the last entry handed over, a refused value
// or a withdrawal included; 0 before the first. Call it with Lock held.
func (f *Follower[T]) LastKV() uint64 { return f.lastKV }

// take hands one value over, unless it was handed over before a restart.
func (f *Follower[T]) take(ctx context.Context, v Value[T]) {
	f.Lock.Lock()
	defer f.Lock.Unlock()
	if v.KVRevision <= f.lastKV {
		return // seen before a watch restart
	}
	f.lastKV = v.KVRevision
	trigger := "kv@" + strconv.FormatUint(v.KVRevision, 10)
	switch {
	case v.Deleted:
		if !f.offered {
			return
		}
		f.offered = false
		f.Handler.Withdraw(ctx, trigger, v)
	case v.Err != nil:
		f.Handler.Refuse(ctx, trigger, v)
	default:
		f.offered = true
		f.Handler.Offer(ctx, trigger, v)
	}
}
