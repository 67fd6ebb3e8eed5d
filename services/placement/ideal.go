package placement

import (
	"github.com/toposched/toposched/internal/placer"
)

// compact is the Compact rule of the service's state; nil when it is off
// (no bound, no reservation to bound the wait, or another strategy).
func (s *Service) compact() *placer.Compact {
	if s.maxStretch <= 0 || s.reserveAfter < 0 || s.strategy != placer.StrategyTopologyAware {
		return nil
	}
	s.ideals.Store, s.ideals.Fabric, s.ideals.Bandwidths, s.ideals.Budget = s.store, s.fabric, s.bandwidths.Load(), s.searchBudget
	return &placer.Compact{MaxStretch: s.maxStretch, Ideal: s.ideals.Comm, IdealOn: s.ideals.CommOn}
}
