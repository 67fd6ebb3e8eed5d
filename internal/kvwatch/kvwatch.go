// Package kvwatch holds what the sets toposched distributes through NATS
// KV share (policy sets, calibration sets): one value under one key of a
// bucket named for the subject prefix, opened without changing an
// operator's configuration, and watched from the value in force on.
package kvwatch

import (
	"context"
	"errors"
	"fmt"
	"strings"

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

// Watch hands fn every value of key, the one in force first, and calls
// ready (if not nil) once that one is handed over. It returns nil when ctx
// ends, and an error when the watcher stops on its own.
func Watch(ctx context.Context, kv jetstream.KeyValue, key string, ready func(), fn func(jetstream.KeyValueEntry)) error {
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
		fn(e)
	}
}
