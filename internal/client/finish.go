package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// FinishOutcome is what placement did with a finish.
type FinishOutcome string

// Finish outcomes.
const (
	// FinishReleased: the job held GPUs; they are free.
	FinishReleased FinishOutcome = "finished"
	// FinishWithdrawn: the job was waiting or not yet analysed; it leaves
	// the queue and will never be placed.
	FinishWithdrawn FinishOutcome = "withdrawn"
	// FinishAlready: the job had finished before; nothing was sent.
	FinishAlready FinishOutcome = "already finished"
	// FinishUnknown: nothing was ever submitted under the id; nothing was
	// sent.
	FinishUnknown FinishOutcome = "unknown"
	// FinishNoAnswer: the finish was sent, and placement did not answer
	// within the wait (it may not be running).
	FinishNoAnswer FinishOutcome = "no answer"
	// FinishRefused: placement could not read the finish; nothing changed.
	FinishRefused FinishOutcome = "refused"
)

// FinishResult is a finish and placement's answer to it.
type FinishResult struct {
	Outcome FinishOutcome
	// Released is placement's answer, for FinishReleased and
	// FinishWithdrawn.
	Released *events.PlacementReleased
	// Refused is placement's answer, for FinishRefused.
	Refused *events.PlacementFinishRefused
	// History is the job's history read before anything was sent; nil
	// when it could not be read (a launcher allowed to publish but not to
	// read the jobs stream).
	History *JobHistory
}

// FinishAndWait says a job ended and waits up to wait for placement's
// answer (the placement.released its finish causes, or the
// placement.finish_refused of one it could not read). A job never
// submitted, or already finished, is reported without sending anything.
func FinishAndWait(ctx context.Context, b *bus.Bus, jobID string, status events.JobStatus, wait time.Duration) (FinishResult, error) {
	var res FinishResult
	hist, err := History(ctx, b, jobID)
	switch {
	case errors.Is(err, ErrUnknownJob):
		res.Outcome = FinishUnknown
		return res, nil
	case err == nil:
		res.History = hist
		if hist.State == StateFinished {
			res.Outcome = FinishAlready
			return res, nil
		}
	}
	// A history that cannot be read (no permission to the jobs stream)
	// leaves the answer to placement.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	ready := make(chan struct{})
	answer := make(chan Outcome, 1)
	watched := make(chan error, 1)
	var finishID string
	sent := make(chan struct{})
	go func() {
		watched <- Watch(wctx, b, FromNow, ready, func(o Outcome) error {
			if (o.Released == nil && o.FinishRefused == nil) || o.JobID() != jobID {
				return nil
			}
			select {
			case <-sent:
			case <-wctx.Done():
				return wctx.Err()
			}
			if o.Env.CausationID != finishID {
				return nil // an earlier finish's answer
			}
			answer <- o
			return bus.ErrStop
		})
	}()
	select {
	case <-ready:
	case err := <-watched:
		return res, fmt.Errorf("finish %s: %w", jobID, err)
	}
	env, err := Finish(ctx, b, jobID, status)
	if err != nil {
		return res, err
	}
	finishID = env.ID
	close(sent)
	select {
	case o := <-answer:
		if o.FinishRefused != nil {
			res.Refused, res.Outcome = o.FinishRefused, FinishRefused
			break
		}
		res.Released = o.Released
		res.Outcome = FinishWithdrawn
		if len(o.Released.Nodes) > 0 {
			res.Outcome = FinishReleased
		}
	case err := <-watched:
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return res, fmt.Errorf("finish %s: %w", jobID, err)
		}
		res.Outcome = FinishNoAnswer
	}
	return res, nil
}
