package aware

import (
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
)

// placeKnobs is Place with the tests' knobs set: the slower references
// the tests hold the decisions to.
func placeKnobs(req engine.Request, k knobs) outcome.Result {
	ours, _ := placeWithBaseline(req, k)
	return ours
}
