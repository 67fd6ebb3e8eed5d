package bus

import (
	"fmt"
	"testing"

	"github.com/toposched/toposched/events"
)

// A valid body is remembered and answered from the cache; an invalid one
// fails every time; the cache stays bounded and forgets the oldest.
func TestValidateCache(t *testing.T) {
	t.Parallel()
	c := newValidationCache(validateCacheSize)
	validate := c.validate
	good := []byte(`{"job_id":"v1","gpus":2}`)
	bad := []byte(`{"job_id":"v1","gpus":"two"}`)
	for range 2 {
		if err := validate(events.NameJobSubmitted, good); err != nil {
			t.Fatalf("valid body: %v", err)
		}
		if err := validate(events.NameJobSubmitted, bad); err == nil {
			t.Fatal("invalid body passed")
		}
	}
	// The same bytes under another event name are checked against that
	// event's schema, not answered from the cache.
	if err := validate(events.NameJobFinished, good); err == nil {
		t.Fatal("a jobs.submitted body passed as jobs.finished")
	}
	for i := range validateCacheSize + 10 {
		if err := validate(events.NameJobSubmitted, fmt.Appendf(nil, `{"job_id":"c%d","gpus":1}`, i)); err != nil {
			t.Fatal(err)
		}
	}
	n, r := c.len()
	if n != validateCacheSize || r != validateCacheSize {
		t.Errorf("cache holds %d keys in a ring of %d, want %d", n, r, validateCacheSize)
	}
}

// Caches are per bus: what one learnt is not known to another, and a nil
// cache validates every time.
func TestValidateCachePerBus(t *testing.T) {
	t.Parallel()
	a, b := newValidationCache(8), newValidationCache(8)
	good := []byte(`{"job_id":"p1","gpus":1}`)
	if err := a.validate(events.NameJobSubmitted, good); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.len(); n != 1 {
		t.Errorf("cache a holds %d keys, want 1", n)
	}
	if n, _ := b.len(); n != 0 {
		t.Errorf("cache b holds %d keys, want 0", n)
	}
	var none *validationCache
	if err := none.validate(events.NameJobSubmitted, []byte(`{"job_id":"p1","gpus":"x"}`)); err == nil {
		t.Error("nil cache passed an invalid body")
	}
	if err := none.validate(events.NameJobSubmitted, good); err != nil {
		t.Errorf("nil cache: %v", err)
	}
}
