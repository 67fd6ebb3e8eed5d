package optimizer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/store"
)

// unpaidTrades offers to undo the fit trades that did not pay. A job
// topology-aware sent to a tighter fit on a slower box, to keep a fast
// node whole for a larger job the forecast of demand expected (its
// decision's Explanation.FitTrade, made), is proposed the move back once
// the forecast's horizon (the job's expected run, from the decision) has
// passed and the node kept is still as free as it was: the job it was kept
// for did not come, and this one still runs slower for it. The move is
// planned and weighed as every proposal (proposeMove: at least
// MinMigrationGain of the step, the break-even time), the fastest
// placement winning over a tighter fit. Called when GPUs are freed, as
// reconsider is.
func (s *Service) unpaidTrades(ctx context.Context) error {
	now := s.now()
	var snap *store.Snapshot
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id, lj := range s.live {
			if tradeDue(lj, now) && !yield(id) {
				return
			}
		}
	}) {
		if snap == nil {
			snap = s.store.Snapshot()
		}
		lj := s.live[id]
		tr := lj.decision.Explanation.FitTrade
		node := strings.TrimPrefix(tr.Node, store.DomainNode+":")
		_, free, ok := snap.NodeFree(node, "")
		// As free as when it was kept.
		if !ok || len(free) < tr.NodeFree {
			continue
		}
		kept := time.Duration(tr.HorizonSeconds * float64(time.Second)).Round(time.Second)
		why := fmt.Sprintf("%s was kept whole for a job of %d or more GPUs expected within %s, and stayed unused", node, tr.MinGPUs, kept)
		if err := s.proposeMove(ctx, lj, events.MigrationBetterPlacement, why, true); err != nil {
			return err
		}
	}
	return nil
}

// tradeDue reports whether a live job was placed by a fit trade whose
// horizon has passed by now.
func tradeDue(lj *liveJob, now time.Time) bool {
	d := lj.decision
	if lj.spec == nil || lj.tuning == nil || d == nil || d.Explanation == nil {
		return false
	}
	tr := d.Explanation.FitTrade
	if tr == nil || !tr.Made || tr.HorizonSeconds <= 0 || d.Migration != nil {
		return false
	}
	return !now.Before(d.DecidedAt.Add(time.Duration(tr.HorizonSeconds * float64(time.Second))))
}
