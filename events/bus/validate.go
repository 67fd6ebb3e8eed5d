package bus

import (
	"crypto/sha256"
	"sync"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

// validateCacheSize bounds the bodies remembered as valid.
const validateCacheSize = 4096

// validated remembers the last validateCacheSize (event name, body) pairs
// that met their schema, by SHA-256. In one process the same bytes are
// validated by their publisher and then by every subscriber in the
// process (all services in one operator: analysis publishes
// jobs.analyzed, placement receives it; placement publishes
// placement.decided, the optimizer and watchers receive it), and JSON
// Schema validation is a tenth of an all-in-one operator's CPU; the same
// bytes against the same compiled schema give the same answer, so the
// second and later checks are a hash. Failures are never remembered.
var validated = struct {
	sync.Mutex
	seen map[[sha256.Size]byte]struct{}
	ring [][sha256.Size]byte
	next int
}{seen: make(map[[sha256.Size]byte]struct{}, validateCacheSize)}

// validate is schemas.Validate, answered from validated when the same
// body of the same event already passed.
func validate(name events.Name, body []byte) error {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(body)
	var key [sha256.Size]byte
	h.Sum(key[:0])

	validated.Lock()
	_, ok := validated.seen[key]
	validated.Unlock()
	if ok {
		return nil
	}
	if err := schemas.Validate(string(name), body); err != nil {
		return err
	}
	validated.Lock()
	defer validated.Unlock()
	if _, ok := validated.seen[key]; ok {
		return nil
	}
	if len(validated.ring) < validateCacheSize {
		validated.ring = append(validated.ring, key)
	} else {
		delete(validated.seen, validated.ring[validated.next])
		validated.ring[validated.next] = key
		validated.next = (validated.next + 1) % validateCacheSize
	}
	validated.seen[key] = struct{}{}
	return nil
}
