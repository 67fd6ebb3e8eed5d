package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// DefaultAgentTTL is how long an agent may be silent before its jobs are
// lost: six of its default heartbeats, so that with the default grace the
// shims still give the agent three heartbeats (Config.Silence) before they
// stop its ranks.
const DefaultAgentTTL = 6 * DefaultHeartbeat

// WatchdogConfig is the watchdog's configuration.
type WatchdogConfig struct {
	// AgentTTL is how long after an agent's last heartbeat the GPUs of
	// its jobs may be given away (toposched serve --agent-ttl; the
	// agents' own --agent-ttl should match it): DefaultAgentTTL by
	// default there; it must be positive.
	AgentTTL time.Duration
}

// Validate names the bad field.
func (c WatchdogConfig) Validate() error {
	if c.AgentTTL <= 0 {
		return fmt.Errorf("watchdog: agent TTL %s: must be positive", c.AgentTTL)
	}
	return nil
}

// Watchdog finishes as lost the jobs no agent answers for. Replicas may
// run side by side: a second finish of a job is one placement already
// answered ("had already finished"), and changes nothing.
type Watchdog struct {
	b   *bus.Bus
	ttl time.Duration
	log *slog.Logger
	now func() time.Time
	// ready is closed once the stored jobs are read and the follows run.
	ready chan struct{}

	mu sync.Mutex
	// jobs are the live decisions of jobs with a command.
	jobs map[string]*watched
	// commands are the jobs submitted with a command, until decided.
	commands map[string]bool
	agents   map[string]*seenAgent
	started  time.Time
}

type watched struct {
	nodes []string
	// since is when the watch began: the decision, or the watchdog's start
	// for one decided before it.
	since time.Time
	// claimed are the nodes whose agent has listed the job.
	claimed map[string]bool
	// finishing is set once the watchdog has published the job's finish.
	finishing bool
}

type seenAgent struct {
	id   string
	last time.Time
	jobs map[string]bool
	// warned: this run of the agent was told of as outliving the TTL.
	warned bool
}

// NewWatchdog checks cfg and makes a watchdog over the bus; Run starts it.
func NewWatchdog(cfg WatchdogConfig, deps Deps) (*Watchdog, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Watchdog{b: deps.Bus, ttl: cfg.AgentTTL, log: deps.log().With("room", "watchdog"), now: time.Now, ready: make(chan struct{}),
		jobs: map[string]*watched{}, commands: map[string]bool{}, agents: map[string]*seenAgent{}}, nil
}

// Ready is closed once the watchdog has read the stored jobs and follows
// the streams.
func (w *Watchdog) Ready() <-chan struct{} { return w.ready }

// Run watches until ctx ends.
func (w *Watchdog) Run(ctx context.Context) error {
	if w.b == nil {
		return errors.New("watchdog: deps: Bus is required to run")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := waitStreams(ctx, w.b, w.log, events.DomainJobs, events.DomainPlacement, events.DomainAgent); err != nil {
		return nil
	}
	w.started = w.now()
	recs := make(chan bus.Record, 256)
	errc := make(chan error, 3)
	follow := func(domain events.Domain, names ...events.Name) <-chan struct{} {
		return followInto(ctx, w.b, recs, errc, domain, names...)
	}
	readies := []<-chan struct{}{
		follow(events.DomainJobs, events.NameJobSubmitted),
		follow(events.DomainPlacement, events.NamePlacementDecided, events.NamePlacementReleased),
		follow(events.DomainAgent, events.NameAgentHeartbeat),
	}
	if err := awaitFollows(ctx, readies, errc); err != nil {
		return fmt.Errorf("watchdog: %w", err)
	}
	if ctx.Err() != nil {
		return nil
	}
	// What is stored: the submissions first, so that a decision read
	// next knows whether its job has a command.
	for _, src := range []struct {
		domain events.Domain
		names  []events.Name
	}{
		{events.DomainJobs, []events.Name{events.NameJobSubmitted}},
		{events.DomainPlacement, []events.Name{events.NamePlacementDecided, events.NamePlacementReleased}},
	} {
		var subjects []string
		for _, n := range src.names {
			subjects = append(subjects, w.b.Subjects.Of(n))
		}
		if err := w.b.Replay(ctx, src.domain, subjects, func(r bus.Record) error {
			w.apply(r)
			return nil
		}); err != nil {
			return fmt.Errorf("watchdog: read %s: %w", src.domain, err)
		}
	}
	close(w.ready)
	w.log.Info("watchdog ready", "agent_ttl", w.ttl, "jobs", len(w.jobs))
	tick := time.NewTicker(max(w.ttl/8, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if err = followEnded(ctx, err); err != nil {
				return fmt.Errorf("watchdog: %w", err)
			}
			return nil
		case r := <-recs:
			w.apply(r)
		case <-tick.C:
			for _, fin := range w.check() {
				if _, err := w.b.Publish(ctx, fin); err != nil {
					w.log.Error("jobs.finished not sent", "job_id", fin.JobID, "err", err)
					w.mu.Lock()
					if j, ok := w.jobs[fin.JobID]; ok {
						j.finishing = false // tried again next tick
					}
					w.mu.Unlock()
					continue
				}
				w.log.Warn("job lost: its GPUs are freed", "job_id", fin.JobID, "reason", fin.Reason, "message", fin.Message)
			}
		}
	}
}

func (w *Watchdog) apply(r bus.Record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch r.Name {
	case events.NameJobSubmitted:
		var j events.JobSubmitted
		if bus.Decode(r.Name, r.Body, &j) == nil && j.Command != "" {
			w.commands[j.JobID] = true
		}
	case events.NamePlacementDecided:
		var d events.PlacementDecided
		if bus.Decode(r.Name, r.Body, &d) != nil || !w.commands[d.JobID] {
			return
		}
		j := &watched{since: r.Env.Time, claimed: map[string]bool{}}
		if j.since.Before(w.started) {
			j.since = w.started
		}
		for _, np := range d.Nodes {
			j.nodes = append(j.nodes, np.Node)
		}
		if old, ok := w.jobs[d.JobID]; ok {
			// A migration: the nodes the job keeps stay claimed.
			for n := range old.claimed {
				if slices.Contains(j.nodes, n) {
					j.claimed[n] = true
				}
			}
		}
		w.jobs[d.JobID] = j
	case events.NamePlacementReleased:
		id := r.Env.Subject
		delete(w.jobs, id)
		delete(w.commands, id)
		for _, a := range w.agents {
			delete(a.jobs, id)
		}
	case events.NameAgentHeartbeat:
		var h events.AgentHeartbeat
		if bus.Decode(r.Name, r.Body, &h) != nil {
			return
		}
		a := &seenAgent{id: h.Agent, last: w.now(), jobs: map[string]bool{}}
		if old := w.agents[h.Node]; old != nil && old.id == h.Agent {
			a.warned = old.warned
		}
		if stop := time.Duration(h.RanksStopAfterSeconds * float64(time.Second)); !a.warned && (stop == 0 || stop >= w.ttl) {
			// Its ranks would still run on GPUs this watchdog frees.
			a.warned = true
			msg := fmt.Sprintf("the agent's ranks stop %s after its last heartbeat, not within this watchdog's TTL %s: give the agent --agent-ttl %s", stop, w.ttl, w.ttl)
			if stop == 0 {
				msg = fmt.Sprintf("the agent's ranks run on without it (agent --agent-ttl 0), past this watchdog's TTL %s: give the agent --agent-ttl %s", w.ttl, w.ttl)
			}
			w.log.Warn("agent outlives the TTL: a lost job's GPUs may be given away while its ranks run", "node", h.Node, "agent", h.Agent, "message", msg)
		}
		for _, aj := range h.Jobs {
			a.jobs[aj.JobID] = true
			if j, ok := w.jobs[aj.JobID]; ok {
				j.claimed[h.Node] = true
			}
		}
		w.agents[h.Node] = a
	}
}

// check returns the finishes of the jobs lost now.
func (w *Watchdog) check() []*events.JobFinished {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	var out []*events.JobFinished
	for _, id := range slices.Sorted(maps.Keys(w.jobs)) {
		j := w.jobs[id]
		if j.finishing {
			continue
		}
		for _, node := range j.nodes {
			a := w.agents[node]
			var fin *events.JobFinished
			switch {
			case j.claimed[node] && a != nil && now.Sub(a.last) > w.ttl:
				fin = &events.JobFinished{JobID: id, Status: events.StatusLost, Reason: events.ReasonAgentLost,
					Message: fmt.Sprintf("the agent of node %s has been silent for %s (TTL %s)", node, now.Sub(a.last).Round(time.Millisecond), w.ttl)}
			case !j.claimed[node] && now.Sub(j.since) > w.ttl:
				msg := fmt.Sprintf("no agent took the job's ranks on node %s within %s of its decision", node, w.ttl)
				if a != nil && now.Sub(a.last) <= w.ttl {
					msg = fmt.Sprintf("the agent of node %s is alive but did not take the job within %s of its decision", node, w.ttl)
				}
				fin = &events.JobFinished{JobID: id, Status: events.StatusLost, Reason: events.ReasonNoAgent, Message: msg}
			}
			if fin != nil {
				j.finishing = true
				out = append(out, fin)
				break
			}
		}
	}
	return out
}
