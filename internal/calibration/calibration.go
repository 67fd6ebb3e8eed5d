// Package calibration distributes the cost model's calibration sets
// (collective.Calibration) through NATS KV, as policies distributes policy
// sets: topoctl calibration push puts a set, every placement and optimizer
// replica watches it and answers with policy.calibration_applied or
// policy.calibration_rejected, and the bucket's history keeps the last
// versions for audit and rollback. The optimizer's online calibration puts
// its moves there too, so everything that predicts uses one set.
package calibration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events/kvwatch"
	"github.com/toposched/toposched/internal/collective"
)

// KVKey is the key of the set in force.
const KVKey = "set"

// History is how many versions the bucket keeps.
const History = 32

// BucketName is the KV bucket of calibration sets under a subject prefix,
// such as toposched-calibration.
func BucketName(prefix string) string { return kvwatch.BucketName(prefix, "calibration") }

// KVConfig is the bucket's configuration under prefix.
func KVConfig(prefix string, replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       BucketName(prefix),
		Description:  "toposched cost-model calibration sets (topoctl calibration push, online calibration); one set per revision under key " + KVKey,
		MaxValueSize: collective.MaxCalibrationSize,
		History:      History,
		Storage:      jetstream.FileStorage,
		Replicas:     max(replicas, 1),
	}
}

// EnsureKV creates the bucket under prefix, or updates it to this
// configuration. Safe to run from every replica at start-up.
func EnsureKV(ctx context.Context, js jetstream.JetStream, prefix string, replicas int) (jetstream.KeyValue, error) {
	cfg := KVConfig(prefix, replicas)
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("calibration bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// OpenKV opens the bucket, creating it with one replica when it does not
// exist; it never changes an existing bucket (EnsureKV does).
func OpenKV(ctx context.Context, js jetstream.JetStream, prefix string) (jetstream.KeyValue, error) {
	cfg := KVConfig(prefix, 1)
	kv, err := kvwatch.Open(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("calibration bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Revision names a set's contents: the SHA-256 of the value, hex. The
// same file pushed twice has one revision; garbage has one too, so that a
// refusal can name it.
func Revision(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Encode is a set as it is stored: indented JSON, as model calibrate
// writes it, so a stored set reads as its file did.
func Encode(c *collective.Calibration) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("calibration %s: %w", c.Name, err)
	}
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode calibration %s: %w", c.Name, err)
	}
	return append(data, '\n'), nil
}

// EntryName is how a stored value is named in errors: bucket@revision.
func EntryName(bucket string, kvRev uint64) string {
	return bucket + "@" + strconv.FormatUint(kvRev, 10)
}

// Push checks the file's contents as every replica will (file names it in
// errors, with lines) and puts them under KVKey unchanged. It returns the
// set's revision and the KV entry's.
func Push(ctx context.Context, kv jetstream.KeyValue, file string, data []byte) (string, uint64, error) {
	if _, err := collective.ParseCalibration(file, data); err != nil {
		return "", 0, err
	}
	kvRev, err := kv.Put(ctx, KVKey, data)
	if err != nil {
		return "", 0, fmt.Errorf("push calibration to %s/%s: %w", kv.Bucket(), KVKey, err)
	}
	return Revision(data), kvRev, nil
}

// ErrMoved is returned by Update when the set in force changed since the
// revision it was given.
var ErrMoved = errors.New("the calibration in force changed meanwhile")

// Update puts c in place of the entry of revision after (0: when there is
// none yet), and fails with ErrMoved when another set came first: the
// optimizer's online moves never overwrite a push they did not see.
func Update(ctx context.Context, kv jetstream.KeyValue, c *collective.Calibration, after uint64) (uint64, error) {
	data, err := Encode(c)
	if err != nil {
		return 0, err
	}
	var kvRev uint64
	if after == 0 {
		kvRev, err = kv.Create(ctx, KVKey, data)
	} else {
		kvRev, err = kv.Update(ctx, KVKey, data, after)
	}
	// Create's conflict is ErrKeyExists; Update's ErrKeyRevisionMismatch
	// (whatever code a replicated stream reports it with).
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, ErrMoved
	}
	if err != nil {
		return 0, fmt.Errorf("update calibration in %s/%s: %w", kv.Bucket(), KVKey, err)
	}
	return kvRev, nil
}

// Entry is one value of the key, read: its Revision is the value's (see
// Revision), Raw the value as stored, Set the parsed set, and Err why it
// was refused, a collective.CalibrationErrors naming the entry and line.
// Name is not read: a refused value may have none.
type Entry = kvwatch.Value[collective.Calibration]

// DecodeValue parses a stored value (a kvwatch.Decoder, for a
// kvwatch.Follower of the bucket); errors name the value bucket@revision.
func DecodeValue(_ context.Context, bucket string, u *Entry) {
	u.Revision = Revision(u.Raw)
	u.Set, u.Err = collective.ParseCalibration(EntryName(bucket, u.KVRevision), u.Raw)
}

// InForce is the latest entry; nil when nothing was ever pushed or the
// last push was withdrawn.
func InForce(ctx context.Context, kv jetstream.KeyValue) (*Entry, error) {
	e, err := kv.Get(ctx, KVKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read calibration %s/%s: %w", kv.Bucket(), KVKey, err)
	}
	u := kvwatch.Read(ctx, kv.Bucket(), e, DecodeValue)
	return &u, nil
}

// HistoryOf lists the stored versions, oldest first.
func HistoryOf(ctx context.Context, kv jetstream.KeyValue) ([]Entry, error) {
	hist, err := kv.History(ctx, KVKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read calibration history %s/%s: %w", kv.Bucket(), KVKey, err)
	}
	out := make([]Entry, len(hist))
	for i, e := range hist {
		out[i] = kvwatch.Read(ctx, kv.Bucket(), e, DecodeValue)
	}
	return out, nil
}
