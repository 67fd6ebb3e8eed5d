package bus

import (
	"crypto/sha256"
	"sync"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/schemas"
)

// validateCacheSize bounds the bodies a Bus remembers as valid. It must
// cover what publishers run ahead of their subscribers in a burst: with
// 4,096, a burst of 8,000 one-GPU jobs validated 1.9 jobs.analyzed and
// 1.3 placement.decided bodies per decision instead of one each, since
// analysis was thousands of jobs ahead of placement and placement ahead of
// the optimizer. 65,536 keys (about 16,000 decisions of four events) hold
// some 4.5 MB, none of it pointers for the GC to scan.
const validateCacheSize = 1 << 16

// validationCache remembers the last size (event name, body) pairs that met
// their schema, by SHA-256. In one process the same bytes are validated by
// their publisher and then by every subscriber on the same Bus (all
// services in one operator share one: analysis publishes jobs.analyzed,
// placement receives it; placement publishes placement.decided, the
// optimizer and watchers receive it), and JSON Schema validation is a tenth
// of an all-in-one operator's CPU; the same bytes against the same compiled
// schema give the same answer, so the second and later checks are a hash.
// Failures are never remembered.
//
// Each Bus owns one (created by Connect), so nothing is shared between
// buses or tests; a nil *validationCache validates every time.
type validationCache struct {
	mu   sync.Mutex
	size int
	seen map[[sha256.Size]byte]struct{}
	ring [][sha256.Size]byte
	next int
}

// newValidationCache returns an empty cache of size entries.
func newValidationCache(size int) *validationCache {
	return &validationCache{size: size, seen: make(map[[sha256.Size]byte]struct{}, size)}
}

// validate is schemas.Validate, answered from the cache when the same body
// of the same event already passed.
func (c *validationCache) validate(name events.Name, body []byte) error {
	if c == nil {
		return schemas.Validate(string(name), body)
	}
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(body)
	var key [sha256.Size]byte
	h.Sum(key[:0])

	c.mu.Lock()
	_, ok := c.seen[key]
	c.mu.Unlock()
	if ok {
		return nil
	}
	if err := schemas.Validate(string(name), body); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[key]; ok {
		return nil
	}
	if len(c.ring) < c.size {
		c.ring = append(c.ring, key)
	} else {
		delete(c.seen, c.ring[c.next])
		c.ring[c.next] = key
		c.next = (c.next + 1) % c.size
	}
	c.seen[key] = struct{}{}
	return nil
}

// len reports how many keys the cache holds and the length of its ring.
func (c *validationCache) len() (keys, ring int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen), len(c.ring)
}
