package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Move gives a running job a new set of GPUs in one transaction: a
// migration. GPUs in both sets stay the job's; each new GPU must exist, be
// healthy and be free (or already the job's); the job's GPUs not in gpus are
// freed. If any new GPU is unavailable, nothing changes and the error wraps
// ErrConflict and names each GPU at fault. Because the new GPUs are taken in
// the same transaction that frees the old ones, no reader ever sees a GPU
// held twice, nor the job holding neither set.
//
// It returns the GPUs freed, sorted by node name and index. Moving a job to
// the set it holds is a no-op success, so a replay is harmless. A job that
// holds no GPUs cannot move: use Allocate.
func (s *Store) Move(jobID string, gpus []GPUKey) ([]GPUKey, error) {
	return s.move(jobID, gpus, false)
}

// RestoreMove re-applies a move that was already committed, as Restore
// re-applies an allocation when a replica rebuilds: a new GPU that is by
// now unhealthy or gone is still given to the job (recreated, unhealthy,
// where gone), and a job holding nothing simply gets gpus. A GPU held by
// another job is still a conflict, and nothing changes then.
func (s *Store) RestoreMove(jobID string, gpus []GPUKey) ([]GPUKey, error) {
	return s.move(jobID, gpus, true)
}

func (s *Store) move(jobID string, gpus []GPUKey, restore bool) ([]GPUKey, error) {
	if jobID == "" {
		return nil, errors.New("store: move: empty job id")
	}
	if len(gpus) == 0 {
		return nil, fmt.Errorf("store: move %q: no GPUs given", jobID)
	}
	want := slices.Clone(gpus)
	slices.SortFunc(want, compareKeys)
	for i := 1; i < len(want); i++ {
		if want[i] == want[i-1] {
			return nil, fmt.Errorf("store: move %q: GPU %s given twice", jobID, want[i])
		}
	}
	var freed []GPUKey
	err := s.write(func(w *writer) error {
		txn := w.txn
		held, err := gpusOfJob(txn, jobID)
		if err != nil {
			return err
		}
		if len(held) == 0 && !restore {
			return fmt.Errorf("store: move %q: the job holds no GPUs; allocate instead", jobID)
		}
		mine := make(map[GPUKey]bool, len(held))
		for _, g := range held {
			mine[g.Key()] = true
		}
		olds, upds, problems, err := claim(txn, jobID, want, restore, func(k GPUKey) bool { return mine[k] })
		if err != nil {
			return err
		}
		if len(problems) > 0 {
			return fmt.Errorf("%w: move job %q: %s", ErrConflict, jobID, strings.Join(problems, "; "))
		}
		// Take the new GPUs, then free the old: one transaction, so the
		// order is for the reader of this code, not of the store.
		for i, g := range upds {
			if err := w.putGPU(olds[i], g); err != nil {
				return err
			}
		}
		keep := make(map[GPUKey]bool, len(want))
		for _, k := range want {
			keep[k] = true
		}
		for _, g := range held {
			if keep[g.Key()] {
				continue
			}
			freed = append(freed, g.Key())
			if err := w.freeGPU(g); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(freed, compareKeys)
	return freed, nil
}
