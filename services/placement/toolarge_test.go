package placement_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/services/placement"
)

// sizeLimited is the bus with NATS's refusal of a message over its
// max_payload, for the decisions refuse picks.
type sizeLimited struct {
	*bus.Bus
	refuse func(*events.PlacementDecided) bool
}

func (l sizeLimited) Publish(ctx context.Context, v any) (events.Envelope, error) {
	if err := l.tooLarge(v); err != nil {
		return events.Envelope{}, err
	}
	return l.Bus.Publish(ctx, v)
}

// PublishAsync refuses before sending, as the client does over max_payload.
func (l sizeLimited) PublishAsync(ctx context.Context, v any) (events.Envelope, *bus.Pending, error) {
	if err := l.tooLarge(v); err != nil {
		return events.Envelope{}, nil, err
	}
	return l.Bus.PublishAsync(ctx, v)
}

func (l sizeLimited) tooLarge(v any) error {
	if d, ok := v.(*events.PlacementDecided); ok && l.refuse(d) {
		body, _ := json.Marshal(d)
		return &bus.TooLargeError{Subject: "toposched.placement.decided", Size: len(body) + 60<<20, Limit: 8 << 20}
	}
	return nil
}

// A decision over one message (a job of tens of thousands of ranks) is
// published without its explanation and NCCL files; when even that is too
// big the job is rejected with decision_too_large and its GPUs stay free,
// and the handler succeeds: before, the refusal was the handler's
// permanent error, so the job's analysis was dead-lettered and the job got
// no answer (and a finish whose retry of the queue met it was lost).
func TestDecisionTooLarge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		refuse func(*events.PlacementDecided) bool
		want   store.JobState
	}{
		{"fits without its explanation", func(d *events.PlacementDecided) bool { return d.Explanation != nil }, store.JobPlaced},
		{"never fits", func(*events.PlacementDecided) bool { return true }, store.JobRejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := eventstest.Server(t)
			b := eventstest.Bus(t, srv.ClientURL(), "test")
			ctx := eventstest.Context(t, 30*time.Second)
			for _, name := range []string{"n1", "n2"} {
				node := fixtures.PlainNode(name, "A100", 8)
				if _, err := b.Publish(ctx, &node); err != nil {
					t.Fatal(err)
				}
			}
			s, err := placement.New(placement.Config{}, placement.Deps{Publish: sizeLimited{b, tc.refuse}, Read: b, Consume: b, Subjects: b.Subjects})
			if err != nil {
				t.Fatal(err)
			}
			if err := s.OnAnalyzed(ctx, events.Envelope{ID: "e1"}, analyzed(t, events.JobSubmitted{JobID: "wide", GPUs: 16})); err != nil {
				t.Fatalf("the handler failed (its message would be dead-lettered): %v", err)
			}
			snap := s.Store().Snapshot()
			j, _ := snap.Job("wide")
			if j.State != tc.want {
				t.Fatalf("job %+v, want %s", j, tc.want)
			}
			var published []any
			for _, name := range []events.Name{events.NamePlacementDecided, events.NamePlacementRejected} {
				err := b.Replay(ctx, events.DomainPlacement, []string{b.Subjects.Of(name)}, func(r bus.Record) error {
					v := name.New()
					if err := b.Decode(name, r.Body, v); err != nil {
						return err
					}
					published = append(published, v)
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if len(published) != 1 {
				t.Fatalf("published %d outcomes, want 1", len(published))
			}
			switch ev := published[0].(type) {
			case *events.PlacementDecided:
				if tc.want != store.JobPlaced || ev.Explanation != nil || len(ev.Ranks) != 16 {
					t.Fatalf("decision %+v", ev)
				}
			case *events.PlacementRejected:
				r := ev.Reasons[0]
				if tc.want != store.JobRejected || r.Code != outcome.CodeDecisionTooLarge || r.Field != "gpus" {
					t.Fatalf("rejection %+v", ev)
				}
				if free := snap.FreeCount(); free != 16 {
					t.Fatalf("%d GPUs free after the rejection, want 16", free)
				}
			}
		})
	}
}
