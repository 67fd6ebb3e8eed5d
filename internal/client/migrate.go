package client

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/textout"
)

// Statuses of a Proposal.
const (
	// ProposalOpen: the job still runs where the proposal expects it.
	ProposalOpen = "open"
	// ProposalStale: the job has moved since the proposal was made;
	// placement would refuse it.
	ProposalStale = "stale"
	// ProposalApplied: the job was moved by this proposal.
	ProposalApplied = "applied"
)

// Proposal is a running job's latest migration proposal and where it
// stands.
type Proposal struct {
	events.PlacementMigration
	// Status is open, stale or applied.
	Status string `json:"status"`
	// Superseded counts the job's earlier proposals.
	Superseded int `json:"superseded,omitempty"`
}

// Proposals reads the placement stream and returns the latest migration
// proposal of every running job that has one, by job id.
func Proposals(ctx context.Context, b *bus.Bus) ([]Proposal, error) {
	live := map[string]*events.PlacementDecided{}
	latest := map[string]*Proposal{}
	subj := b.Subjects
	err := b.Replay(ctx, events.DomainPlacement, []string{subj.Of(events.NamePlacementDecided), subj.Of(events.NamePlacementReleased),
		subj.Of(events.NamePlacementMigration)}, func(r bus.Record) error {
		switch r.Name {
		case events.NamePlacementDecided:
			var d events.PlacementDecided
			if b.Decode(r.Name, r.Body, &d) == nil {
				live[d.JobID] = &d
			}
		case events.NamePlacementReleased:
			var rel events.PlacementReleased
			if b.Decode(r.Name, r.Body, &rel) == nil {
				delete(live, rel.JobID)
				delete(latest, rel.JobID)
			}
		case events.NamePlacementMigration:
			var p events.PlacementMigration
			if b.Decode(r.Name, r.Body, &p) == nil {
				n := 0
				if prev := latest[p.JobID]; prev != nil {
					n = prev.Superseded + 1
				}
				latest[p.JobID] = &Proposal{PlacementMigration: p, Superseded: n}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read proposals: %w", err)
	}
	var out []Proposal
	for id, p := range latest {
		d, ok := live[id]
		if !ok {
			continue
		}
		switch {
		case d.Migration != nil && d.Migration.ProposalID == p.ProposalID:
			p.Status = ProposalApplied
		case sameGPUs(d.Nodes, p.CurrentNodes):
			p.Status = ProposalOpen
		default:
			p.Status = ProposalStale
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Proposal) int { return cmp.Compare(a.JobID, b.JobID) })
	return out, nil
}

// AcceptMigration publishes the user's acceptance of a job's proposal
// (the latest when proposalID is empty).
func AcceptMigration(ctx context.Context, b *bus.Bus, jobID, proposalID string) (events.Envelope, error) {
	return b.Publish(ctx, &events.JobMigrationAccepted{JobID: jobID, ProposalID: proposalID})
}

// MigrationAnswer is placement's answer to an acceptance: the new decision
// or the refusal.
type MigrationAnswer struct {
	Decided *events.PlacementDecided          `json:"decided,omitempty"`
	Refused *events.PlacementMigrationRefused `json:"refused,omitempty"`
}

// AcceptMigrationAndWait accepts a job's proposal and waits for
// placement's answer to this very request (matched by its event id), until
// ctx ends.
func AcceptMigrationAndWait(ctx context.Context, b *bus.Bus, jobID, proposalID string) (events.Envelope, MigrationAnswer, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	subj := b.Subjects
	ready := make(chan struct{})
	errc := make(chan error, 1)
	var ans MigrationAnswer
	var reqID string
	idc := make(chan string, 1)
	go func() {
		errc <- b.Follow(ctx, events.DomainPlacement, []string{subj.Of(events.NamePlacementDecided), subj.Of(events.NamePlacementMigrationRefused)}, ready,
			func(r bus.Record) error {
				if r.Env.Subject != jobID {
					return nil
				}
				if reqID == "" {
					// The request is published once Follow is ready;
					// nothing about it can come before its id.
					select {
					case reqID = <-idc:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				switch r.Name {
				case events.NamePlacementDecided:
					var d events.PlacementDecided
					if b.Decode(r.Name, r.Body, &d) == nil && d.Migration != nil && d.Migration.RequestID == reqID {
						ans.Decided = &d
						return bus.ErrStop
					}
				case events.NamePlacementMigrationRefused:
					var ref events.PlacementMigrationRefused
					if b.Decode(r.Name, r.Body, &ref) == nil && ref.RequestID == reqID {
						ans.Refused = &ref
						return bus.ErrStop
					}
				}
				return nil
			})
	}()
	select {
	case <-ready:
	case err := <-errc:
		return events.Envelope{}, ans, err
	}
	env, err := AcceptMigration(ctx, b, jobID, proposalID)
	if err != nil {
		return env, ans, err
	}
	idc <- env.ID
	if err := <-errc; err != nil {
		return env, ans, err
	}
	if ans.Decided == nil && ans.Refused == nil {
		return env, ans, fmt.Errorf("no answer to the migration of %s: %w", jobID, cmp.Or(ctx.Err(), context.Canceled))
	}
	return env, ans, nil
}

// WriteProposals prints proposals as a table.
func WriteProposals(w io.Writer, ps []Proposal) error {
	if len(ps) == 0 {
		_, err := io.WriteString(w, "no migration proposals for running jobs\n")
		return err
	}
	tw := textout.Table(w, 2, 4, 2, ' ', 0)
	tw.Println("JOB\tPROPOSAL\tSTATUS\tREASON\tGAIN/STEP\tBREAK-EVEN\tFROM\tTO")
	for _, p := range ps {
		tw.Printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.JobID, p.ProposalID, p.Status, p.Reason,
			seconds(p.GainSecondsPerStep), seconds(p.BreakEvenSeconds), NodesString(p.CurrentNodes), NodesString(p.Nodes))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range ps {
		if p.Status == ProposalOpen {
			if _, err := fmt.Fprintf(w, "%s: %s\n", p.JobID, p.Message); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteMigrationAnswer prints placement's answer: the job's new placement
// and the one it left, or why it was refused.
func WriteMigrationAnswer(w io.Writer, a MigrationAnswer) error {
	if r := a.Refused; r != nil {
		var b strings.Builder
		fmt.Fprintf(&b, "%s: migration refused", r.JobID)
		if r.ProposalID != "" {
			fmt.Fprintf(&b, " (proposal %s)", r.ProposalID)
		}
		b.WriteString("; the job keeps its placement\n")
		writeReasons(&b, r.Reasons)
		_, err := io.WriteString(w, b.String())
		return err
	}
	d := a.Decided
	if d == nil {
		return nil
	}
	if m := d.Migration; m != nil {
		if _, err := fmt.Fprintf(w, "%s: migrated by proposal %s (%s), from %s\n", d.JobID, m.ProposalID, cmp.Or(m.Reason, "no reason given"), NodesString(m.PreviousNodes)); err != nil {
			return err
		}
	}
	return WriteOutcome(w, Outcome{Name: events.NamePlacementDecided, Decided: d})
}

// NodesString renders a placement compactly: "node:0,1 node:2".
func NodesString(ns []events.NodePlacement) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = n.Node + ":" + n.CUDAVisibleDevices
	}
	return strings.Join(parts, " ")
}

// sameGPUs reports whether two placements use the same GPUs.
func sameGPUs(a, b []events.NodePlacement) bool {
	set := func(ns []events.NodePlacement) map[string]bool {
		m := map[string]bool{}
		for _, n := range ns {
			for _, g := range n.GPUs {
				m[fmt.Sprintf("%s/%d", n.Node, g)] = true
			}
		}
		return m
	}
	sa, sb := set(a), set(b)
	if len(sa) != len(sb) {
		return false
	}
	for k := range sa {
		if !sb[k] {
			return false
		}
	}
	return true
}
