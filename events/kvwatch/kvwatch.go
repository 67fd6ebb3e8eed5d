// Package kvwatch holds what the sets toposched distributes through NATS
// KV share (policy sets, calibration sets): one value under one key of a
// bucket named for the subject prefix, opened without changing an
// operator's configuration, watched from the value in force on, and
// followed by the component that applies it (Follower), once per entry
// across watch restarts.
//
// It is generic over the set's type and knows none: a set's package
// supplies a Decoder. It sits on the events floor beside the bus, being
// JetStream plumbing alone, so that policies (on the floor above) and
// internal/calibration, which define the sets, and the operator, which
// applies them, all import it downward.
package kvwatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events"
)

// BucketName is the bucket of a kind of set under a subject prefix:
// "<prefix>-<kind>", such as toposched-policies. Characters a bucket name
// cannot hold become '_'.
func BucketName(prefix, kind string) string {
	if prefix == "" {
		prefix = events.DefaultPrefix
	}
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, prefix)
	return clean + "-" + kind
}

// Open opens the bucket of cfg, creating it when it does not exist; it
// never changes an existing bucket, whose configuration is the operator's.
func Open(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket) // created meanwhile
		}
	}
	return kv, err
}

// Value is one value of the watched key, read.
type Value[T any] struct {
	// Revision names the set's contents, as the set's package does
	// (policies: the set's revision; calibration: the value's SHA-256).
	Revision string
	// Name is the set's name where the Decoder reads one.
	Name string
	// KVRevision is the entry's revision in the bucket.
	KVRevision uint64
	// Created is when the value was put, by the server's clock.
	Created time.Time
	// Deleted is true when the set was withdrawn (deleted or purged);
	// Raw, Set and Err are then nil.
	Deleted bool
	// Raw is the value as stored.
	Raw []byte
	// Set is the valid set; nil when it was refused.
	Set *T
	// Err is why it was refused, in the set's package's own error type.
	Err error
}

// Decoder reads a stored value, v.Raw of entry v.KVRevision in bucket,
// into v's Revision, Name and either Set or Err. A decoder that checks a
// set by running it (policies run their tests) stops when ctx ends.
type Decoder[T any] func(ctx context.Context, bucket string, v *Value[T])

// Read reads one entry of a bucket.
func Read[T any](ctx context.Context, bucket string, e jetstream.KeyValueEntry, decode Decoder[T]) Value[T] {
	v := Value[T]{KVRevision: e.Revision(), Created: e.Created()}
	if e.Operation() != jetstream.KeyValuePut {
		v.Deleted = true
		return v
	}
	v.Raw = e.Value()
	decode(ctx, bucket, &v)
	return v
}

// Watch hands fn every value of key, the one in force first, read with
// decode, and calls ready (if not nil) once that one is handed over. It
// returns nil when ctx ends, and an error when the watcher stops on its own.
func Watch[T any](ctx context.Context, kv jetstream.KeyValue, key string, decode Decoder[T], ready func(), fn func(Value[T])) error {
	w, err := kv.Watch(ctx, key)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	for {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return nil
		case e, ok = <-w.Updates():
		}
		if !ok {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch bucket %s: watcher stopped", kv.Bucket())
		}
		if e == nil { // every initial value delivered
			if ready != nil {
				ready()
				ready = nil
			}
			continue
		}
		v := Read(ctx, kv.Bucket(), e, decode)
		if ctx.Err() != nil {
			return nil // a check cut short is no verdict on the set
		}
		fn(v)
	}
}
