package store

// Allocations: Allocate and Restore give GPUs to a job in one transaction,
// Release gives them back; claim is the check both they and Move
// (move.go) make of the GPUs a job is to take.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	memdb "github.com/hashicorp/go-memdb"
)

// ErrConflict is wrapped by Allocate's errors when a GPU it was asked for is
// missing, unhealthy or held by another job.
var ErrConflict = errors.New("allocation conflict")

// Allocate gives gpus to jobID in one transaction. It re-checks that every
// GPU exists, is healthy and is free; if any is not, nothing is allocated and
// the error wraps ErrConflict and names each GPU at fault and why. Allocating
// the set the job already holds again is a no-op success (so replays are
// harmless); allocating a different set to a job that holds GPUs is a
// conflict: release first.
func (s *Store) Allocate(jobID string, gpus []GPUKey) error {
	return s.allocate(jobID, gpus, false)
}

// Restore re-applies an allocation that was already committed, as when a
// replica rebuilds from the streams. A rebuild replays the topology streams
// to their end before the allocation log, so a GPU may by then be unhealthy,
// missing from its node's report or on a removed node, where at the time of
// the allocation it was not. Restore still gives it to the job, so that the
// rebuilt store equals the live one: an unhealthy GPU is held as it is, and a
// GPU that no longer exists is recreated, unhealthy (ReasonMissing, or
// ReasonNodeRemoved when its node is gone), until the job releases it.
// A GPU held by another job is still a conflict (ErrConflict), and nothing
// is restored then; a job that holds the same set already is a no-op.
func (s *Store) Restore(jobID string, gpus []GPUKey) error {
	return s.allocate(jobID, gpus, true)
}

func (s *Store) allocate(jobID string, gpus []GPUKey, restore bool) error {
	return s.write(func(w *writer) error { return w.allocate(jobID, gpus, restore) })
}

// allocate is Allocate (Restore when restore) in w's transaction. It
// writes nothing when it fails for a GPU at fault (ErrConflict).
func (w *writer) allocate(jobID string, gpus []GPUKey, restore bool) error {
	if jobID == "" {
		return errors.New("store: allocate: empty job id")
	}
	if len(gpus) == 0 {
		return fmt.Errorf("store: allocate %q: no GPUs given", jobID)
	}
	want := slices.Clone(gpus)
	slices.SortFunc(want, compareKeys)
	for i := 1; i < len(want); i++ {
		if want[i] == want[i-1] {
			return fmt.Errorf("store: allocate %q: GPU %s given twice", jobID, want[i])
		}
	}
	txn := w.txn
	held, err := gpusOfJob(txn, jobID)
	if err != nil {
		return err
	}
	if len(held) > 0 {
		if sameKeys(held, want) {
			return nil
		}
		return fmt.Errorf("%w: job %q already holds %d other GPUs; release them first", ErrConflict, jobID, len(held))
	}
	olds, upds, problems, err := claim(txn, jobID, want, restore, nil)
	if err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: job %q: %s", ErrConflict, jobID, strings.Join(problems, "; "))
	}
	for i, g := range upds {
		if err := w.putGPU(olds[i], g); err != nil {
			return err
		}
	}
	return nil
}

// placeholderGPU returns the unhealthy row Restore creates for a GPU the
// topology no longer has. On a live node it is in the node's node-wide
// domains, as a GPU its report dropped is.
func placeholderGPU(txn *memdb.Txn, k GPUKey) (*GPU, error) {
	g := &GPU{Node: k.Node, Index: k.Index, HealthReason: ReasonNodeRemoved, NUMA: -1}
	raw, err := txn.First(TableNodes, IndexID, k.Node)
	if err != nil {
		return nil, err
	}
	if raw != nil {
		n := raw.(*Node)
		g.Model, g.NodePosition, g.HealthReason = n.GPUModel, n.Position, ReasonMissing
		fabric, err := fabricOf(txn, k.Node)
		if err != nil {
			return nil, err
		}
		g.Domains = nodeDomains(n, []*GPU{g}, fabric)[0]
	}
	return g, nil
}

// Release frees every GPU held by jobID and returns them sorted by node name
// and index. A GPU kept only because the job held it (ReasonMissing,
// ReasonNodeRemoved) is deleted instead of freed. Releasing a job that holds
// nothing returns nil, nil.
func (s *Store) Release(jobID string) ([]GPUKey, error) { return release(s.write, jobID) }

// release is Release through run, a write of the store or of a Txn.
func release(run func(func(w *writer) error) error, jobID string) ([]GPUKey, error) {
	if jobID == "" {
		return nil, nil
	}
	var keys []GPUKey
	err := run(func(w *writer) error {
		var err error
		keys, err = w.release(jobID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return keys, nil
}

// release is Release in w's transaction.
func (w *writer) release(jobID string) ([]GPUKey, error) {
	held, err := gpusOfJob(w.txn, jobID)
	if err != nil {
		return nil, err
	}
	var keys []GPUKey
	for _, g := range held {
		keys = append(keys, g.Key())
		if err := w.freeGPU(g); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(keys, compareKeys)
	return keys, nil
}

// claim reads the GPUs a job is to take, skipping those skip names (ones
// it holds already), and returns their rows before and after (olds[i] nil
// for a placeholder of a GPU no report lists, made only when restore) and
// every reason they cannot be taken: held by a job, unhealthy (allowed when
// restore, which replays what was decided before), missing.
func claim(txn *memdb.Txn, jobID string, want []GPUKey, restore bool, skip func(GPUKey) bool) (olds, upds []*GPU, problems []string, err error) {
	olds = make([]*GPU, 0, len(want))
	upds = make([]*GPU, 0, len(want))
	for _, k := range want {
		if skip != nil && skip(k) {
			continue
		}
		raw, err := txn.First(TableGPUs, IndexID, k.Node, k.Index)
		if err != nil {
			return nil, nil, nil, err
		}
		if raw == nil {
			if !restore {
				problems = append(problems, fmt.Sprintf("GPU %s does not exist", k))
				continue
			}
			g, err := placeholderGPU(txn, k)
			if err != nil {
				return nil, nil, nil, err
			}
			g.JobID = jobID
			olds, upds = append(olds, nil), append(upds, g)
			continue
		}
		g := raw.(*GPU)
		switch {
		case g.JobID != "":
			problems = append(problems, fmt.Sprintf("GPU %s is held by job %q", k, g.JobID))
		case g.HeldBy != "" && !restore:
			problems = append(problems, fmt.Sprintf("GPU %s is held outside toposched (%s)", k, g.HeldBy))
		case !g.Healthy && !restore:
			problems = append(problems, fmt.Sprintf("GPU %s is unhealthy (%s)", k, g.HealthReason))
		default:
			upd := *g
			upd.JobID = jobID
			olds, upds = append(olds, g), append(upds, &upd)
		}
	}
	return olds, upds, problems, nil
}

// freeGPU gives a held GPU back: free again, or gone when it was kept only
// because its job held it (missing from its node's report, or of a removed
// node).
func (w *writer) freeGPU(g *GPU) error {
	if g.HealthReason == ReasonMissing || g.HealthReason == ReasonNodeRemoved {
		return w.putGPU(g, nil)
	}
	upd := *g
	upd.JobID = ""
	return w.putGPU(g, &upd)
}

// sameKeys reports whether held (sorted by node, index, as the job index
// yields them) names exactly want (sorted).
func sameKeys(held []*GPU, want []GPUKey) bool {
	if len(held) != len(want) {
		return false
	}
	for i, g := range held {
		if g.Key() != want[i] {
			return false
		}
	}
	return true
}
