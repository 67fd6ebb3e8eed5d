package bus

import (
	"fmt"
	"testing"

	"github.com/toposched/toposched/events"
)

// A valid body is remembered and answered from the cache; an invalid one
// fails every time; the cache stays bounded and forgets the oldest.
func TestValidateCache(t *testing.T) {
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
	validated.Lock()
	n, r := len(validated.seen), len(validated.ring)
	validated.Unlock()
	if n != validateCacheSize || r != validateCacheSize {
		t.Errorf("cache holds %d keys in a ring of %d, want %d", n, r, validateCacheSize)
	}
}
