package policies

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toposched/toposched/events/kvwatch"
)

// Distribution through NATS KV.
//
// A pushed set is one value, a Bundle holding every file of the set, under
// one key (KVKey) of one bucket (BucketName): a replica sees either the old
// set or the new one, never half of each, and the bucket's history keeps the
// last pushes for audit and rollback.

// KVKey is the key of the pushed set in the bucket.
const KVKey = "set"

// MaxBundleSize bounds an encoded bundle: policy sets are a handful of
// small files, and NATS' default payload limit is 1 MiB.
const MaxBundleSize = 1 << 20

// kvHistory is how many pushes the bucket keeps.
const kvHistory = 16

// CodeBundleError is the Error code of a pushed value that is not a
// readable bundle.
const CodeBundleError = "bundle_error"

// BucketName is the KV bucket of pushed sets under a subject prefix, such as
// toposched-policies. Characters a bucket name cannot hold become '_'.
func BucketName(prefix string) string { return kvwatch.BucketName(prefix, "policies") }

// KVConfig is the configuration of the bucket under prefix.
func KVConfig(prefix string, replicas int) jetstream.KeyValueConfig {
	if replicas < 1 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:       BucketName(prefix),
		Description:  "toposched policy sets pushed with topoctl policy push; one bundle per revision under key " + KVKey,
		MaxValueSize: MaxBundleSize,
		History:      kvHistory,
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
	}
}

// EnsureKV creates the bucket under prefix, or updates it to this
// configuration. Safe to run from every replica at start-up.
func EnsureKV(ctx context.Context, js jetstream.JetStream, prefix string, replicas int) (jetstream.KeyValue, error) {
	cfg := KVConfig(prefix, replicas)
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("policy bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// OpenKV opens the bucket under prefix, creating it with one replica when
// it does not exist yet; it never changes an existing bucket, whose
// configuration is the operator's (EnsureKV).
func OpenKV(ctx context.Context, js jetstream.JetStream, prefix string) (jetstream.KeyValue, error) {
	cfg := KVConfig(prefix, 1)
	kv, err := kvwatch.Open(ctx, js, cfg)
	if err != nil {
		return nil, fmt.Errorf("policy bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Bundle is a pushed set: every file, by path, in one JSON value.
type Bundle struct {
	// Name names the set in events and logs.
	Name string `json:"name"`
	// Revision, when given, must be the revision of Files: a check that
	// the value was not edited by hand into something else.
	Revision string `json:"revision,omitempty"`
	// Files are the set's .rego files and data.json by slash-separated
	// path, as Check reads them from a directory.
	Files map[string]string `json:"files"`
}

// EncodeBundle reads the set in fsys as Check does and encodes it as one
// bundle named name, without compiling it (Push compiles first). It
// returns the value and the set's revision.
func EncodeBundle(name string, fsys fs.FS) ([]byte, string, error) {
	src, err := readSet(fsys)
	if err != nil {
		return nil, "", err
	}
	b := Bundle{Name: name, Revision: src.revision, Files: make(map[string]string, len(src.files))}
	var errs Errors
	for p, content := range src.files {
		// A JSON string holds only UTF-8: anything else would be changed
		// on the way and arrive as another revision.
		if !utf8.Valid(content) {
			errs = append(errs, &Error{File: p, Msg: "not UTF-8 text", Code: CodeBundleError})
		}
		b.Files[p] = string(content)
	}
	if len(errs) > 0 {
		return nil, "", sortErrs(errs)
	}
	if len(b.Files) == 0 {
		return nil, "", Errors{{File: name, Msg: "no .rego files", Code: "io_error"}}
	}
	data, err := json.Marshal(b)
	if err != nil {
		return nil, "", fmt.Errorf("encode policy set %s: %w", name, err)
	}
	if len(data) > MaxBundleSize {
		return nil, "", Errors{{Msg: fmt.Sprintf("policy set %s: bundle is %d bytes, more than the %d bytes a pushed set may hold",
			name, len(data), MaxBundleSize), Code: CodeBundleError}}
	}
	return data, src.revision, nil
}

// DecodeBundle reads a pushed value. It refuses, with an Errors of code
// bundle_error, a value over MaxBundleSize, one that is not a bundle, a
// bundle without files, a path that is not a clean relative path to a
// .rego file or data.json, and a revision that does not match the files.
func DecodeBundle(data []byte) (*Bundle, error) {
	fail := func(file, format string, args ...any) (*Bundle, error) {
		return nil, Errors{{File: file, Msg: fmt.Sprintf(format, args...), Code: CodeBundleError}}
	}
	if len(data) > MaxBundleSize {
		return fail("", "bundle is %d bytes, more than the %d bytes a pushed set may hold", len(data), MaxBundleSize)
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	var b Bundle
	if err := d.Decode(&b); err != nil {
		return fail("", "not a policy bundle: %v", err)
	}
	if d.More() {
		return fail("", "not a policy bundle: data after the JSON object")
	}
	if b.Name == "" {
		return fail("", "bundle has no name")
	}
	if len(b.Files) == 0 {
		return fail("", "bundle %s has no files", b.Name)
	}
	for _, p := range slices.Sorted(func(yield func(string) bool) {
		for k := range b.Files {
			if !yield(k) {
				return
			}
		}
	}) {
		if !fs.ValidPath(p) || p == "." || strings.Contains(p, "\\") {
			return fail(p, "bundle %s: file path %q is not a clean relative path", b.Name, p)
		}
		if !strings.HasSuffix(p, ".rego") && p != DataFile {
			return fail(p, "bundle %s: file %q is neither a .rego file nor %s", b.Name, p, DataFile)
		}
	}
	if b.Revision != "" && b.Revision != revisionOf(b.files()) {
		return fail("", "bundle %s: revision %s does not match its files", b.Name, short(b.Revision))
	}
	return &b, nil
}

func (b *Bundle) files() map[string][]byte {
	m := make(map[string][]byte, len(b.Files))
	for p, c := range b.Files {
		m[p] = []byte(c)
	}
	return m
}

func (b *Bundle) sources() *sources {
	f := b.files()
	return &sources{files: f, revision: revisionOf(f)}
}

// ValueRevision is the revision a pushed value stands for: its set's
// revision when it is a bundle, else the SHA-256 of the value, so that even
// garbage can be named in a policy.rejected.
func ValueRevision(data []byte) string {
	if b, err := DecodeBundle(data); err == nil {
		return revisionOf(b.files())
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Push compiles the set in fsys and runs its tests as the operator will,
// refusing a broken set with its Errors before anything is written; then it
// puts the set as one value under KVKey. It returns the set's revision and
// the KV entry's revision.
func Push(ctx context.Context, kv jetstream.KeyValue, name string, fsys fs.FS) (rev string, kvRev uint64, err error) {
	if _, _, err := Check(ctx, fsys, name); err != nil {
		return "", 0, err
	}
	data, rev, err := EncodeBundle(name, fsys)
	if err != nil {
		return "", 0, err
	}
	kvRev, err = PushBundle(ctx, kv, data)
	return rev, kvRev, err
}

// PushBundle puts an encoded bundle under KVKey as it is, compiled or not,
// and returns the KV entry's revision.
func PushBundle(ctx context.Context, kv jetstream.KeyValue, data []byte) (uint64, error) {
	kvRev, err := kv.Put(ctx, KVKey, data)
	if err != nil {
		return 0, fmt.Errorf("push policy set to %s/%s: %w", kv.Bucket(), KVKey, err)
	}
	return kvRev, nil
}

// KVUpdate is one value of the pushed-set key as a watcher saw it: its
// Revision is the set's (see ValueRevision), Name the bundle's ("unknown"
// when the value is not a bundle), Set the compiled and tested set, and Err
// why it was refused, an Errors naming file and line.
type KVUpdate = kvwatch.Value[Set]

// WatchKV watches the pushed set: it compiles and tests the value in force
// when it starts, then each new one, and hands the set to onSet or, when
// it is refused, its revision and Errors to onError (the caller keeps its
// old set). Withdrawals (delete, purge) are not reported; see
// WatchKVUpdates. It returns nil when ctx ends.
func WatchKV(ctx context.Context, kv jetstream.KeyValue, onSet func(*Set), onError func(rev string, err error)) error {
	return WatchKVUpdates(ctx, kv, nil, func(u KVUpdate) {
		switch {
		case u.Deleted:
		case u.Err != nil:
			onError(u.Revision, u.Err)
		default:
			onSet(u.Set)
		}
	})
}

// WatchKVUpdates is WatchKV reporting every update, withdrawals included.
// It calls ready, if not nil, once the value in force at start (if any)
// has been handed to fn, so a caller can wait for it before going on.
func WatchKVUpdates(ctx context.Context, kv jetstream.KeyValue, ready func(), fn func(KVUpdate)) error {
	return kvwatch.Watch(ctx, kv, KVKey, DecodeValue, ready, fn)
}

// DecodeValue decodes, compiles and tests a pushed value (a
// kvwatch.Decoder, for a kvwatch.Follower of the bucket).
func DecodeValue(ctx context.Context, _ string, u *KVUpdate) {
	u.Set, u.Name, u.Revision, u.Err = compileValue(ctx, u.Raw)
}

// compileValue decodes, compiles and tests a pushed value.
func compileValue(ctx context.Context, data []byte) (*Set, string, string, error) {
	b, err := DecodeBundle(data)
	if err != nil {
		return nil, "unknown", ValueRevision(data), err
	}
	src := b.sources()
	s, _, err := compileSources(ctx, src, b.Name)
	if err != nil {
		var errs Errors
		if !errors.As(err, &errs) {
			errs = Errors{{Msg: err.Error(), Code: "rego_error"}}
		}
		return nil, b.Name, src.revision, errs
	}
	return s, b.Name, src.revision, nil
}
