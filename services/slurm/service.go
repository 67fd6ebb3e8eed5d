package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// Defaults of Config.
const (
	DefaultSqueue    = "squeue"
	DefaultInterval  = time.Second
	DefaultMaxOutput = 64 << 20
	DefaultTimeout   = 30 * time.Second
)

// Config is what the service runs with; zero fields take the defaults.
type Config struct {
	// Squeue is the squeue command (a path, or a name on PATH). It reads
	// SLURM_CONF from the service's environment like any Slurm client.
	Squeue string
	// Interval is the time between two polls.
	Interval time.Duration
	// MaxOutput bounds squeue's output in bytes: a larger one is a failed
	// read, so that a huge queue cannot take the service's memory.
	MaxOutput int64
	// Timeout bounds one squeue call.
	Timeout time.Duration
}

func (c *Config) defaults() {
	if c.Squeue == "" {
		c.Squeue = DefaultSqueue
	}
	if c.Interval <= 0 {
		c.Interval = DefaultInterval
	}
	if c.MaxOutput <= 0 {
		c.MaxOutput = DefaultMaxOutput
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
}

// Deps are the service's connections.
type Deps struct {
	Bus     *bus.Bus
	Log     *slog.Logger
	Metrics *Metrics // nil: none
}

// Service is the Slurm sync service.
type Service struct {
	cfg   Config
	bus   *bus.Bus
	log   *slog.Logger
	met   *Metrics
	ready chan struct{}

	mu sync.Mutex
	// decided are toposched's jobs placement decided and nobody finished,
	// from the streams.
	decided map[string]*events.PlacementDecided
	// ended are the jobs the streams show finished or released: the jobs
	// stream is replayed and followed apart from the placement stream, so
	// a decision may be read after its job's end.
	ended map[string]bool
	// heldSeen is each node's holds as this service last published them
	// (heldKey); a node whose last holds were another publisher's is not
	// in it, and this service leaves it alone while Slurm holds nothing
	// there.
	heldSeen map[string]string

	// The poll loop's own state (one goroutine).
	//
	// seen is the Slurm job last seen for each toposched job id.
	seen map[string]Job
	// reported are the toposched jobs whose mismatch was reported.
	reported map[string]bool
	// down is set while squeue fails, so that an outage is logged once.
	down bool
}

// New makes the service.
func New(cfg Config, d Deps) (*Service, error) {
	if d.Bus == nil {
		return nil, errors.New("slurm: no bus")
	}
	cfg.defaults()
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	return &Service{
		cfg: cfg, bus: d.Bus, log: log, met: d.Metrics, ready: make(chan struct{}),
		decided: map[string]*events.PlacementDecided{}, ended: map[string]bool{}, heldSeen: map[string]string{},
		seen: map[string]Job{}, reported: map[string]bool{},
	}, nil
}

// Ready is closed once the state is rebuilt from the streams and the
// first poll is done.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run rebuilds the state from the streams, follows them, and polls squeue
// every Interval until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	m := &bus.Mirror{Bus: s.bus, Sources: sources}
	if err := m.Rebuild(ctx, s.applyLocked); err != nil {
		return fmt.Errorf("slurm: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	followed := make(chan struct{})
	errs := make(chan error, 1)
	go func() {
		if err := m.Follow(ctx, followed, s.applyLocked); err != nil {
			errs <- fmt.Errorf("slurm: %w", err)
			return
		}
		errs <- nil
	}()
	select {
	case <-followed:
	case err := <-errs:
		return err
	case <-ctx.Done():
		return nil
	}
	s.log.Info("syncing with Slurm", "squeue", s.cfg.Squeue, "interval", s.cfg.Interval)
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	s.poll(ctx)
	close(s.ready)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			if ctx.Err() != nil {
				return nil
			}
			return err
		case <-tick.C:
			s.poll(ctx)
		}
	}
}

// poll reads squeue once and publishes what changed. A failed read
// publishes nothing: an empty queue is not told from a slurmctld that
// does not answer by guessing.
func (s *Service) poll(ctx context.Context) {
	jobs, err := s.read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.met.readFailed()
		if !s.down {
			s.down = true
			s.log.Error("slurm: cannot read the queue; nothing is published until squeue answers again", "err", err)
		}
		return
	}
	if s.down {
		s.down = false
		s.log.Info("slurm: squeue answers again")
	}
	s.syncJobs(ctx, jobs)
	s.syncHeld(ctx, jobs)
}

// read runs squeue --json and parses its output.
func (s *Service) read(ctx context.Context) ([]Job, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.cfg.Squeue, "--json")
	out := &boundedBuffer{max: s.cfg.MaxOutput}
	var stderr boundedBuffer
	stderr.max = 4096
	cmd.Stdout, cmd.Stderr = out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s --json: %w: %s", s.cfg.Squeue, err, strings.TrimSpace(stderr.buf.String()))
	}
	if out.over {
		return nil, fmt.Errorf("%s --json: output over %d bytes (--squeue-max-output)", s.cfg.Squeue, s.cfg.MaxOutput)
	}
	return ParseSqueue(out.buf.Bytes())
}

// boundedBuffer keeps the first max bytes written to it and drops the
// rest, so that the command is never blocked on a full pipe.
type boundedBuffer struct {
	buf  bytes.Buffer
	max  int64
	over bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	room := b.max - int64(b.buf.Len())
	if int64(len(p)) > room {
		b.over = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

// syncHeld publishes the holds of every node whose Slurm-held GPUs
// changed since last published.
func (s *Service) syncHeld(ctx context.Context, jobs []Job) {
	s.mu.Lock()
	held := Held(jobs, func(id string) *events.PlacementDecided { return s.decided[id] })
	nodes := make([]string, 0, len(held)+len(s.heldSeen))
	for n := range held {
		nodes = append(nodes, n)
	}
	for n, key := range s.heldSeen {
		if _, ok := held[n]; !ok && key != "" {
			nodes = append(nodes, n)
		}
	}
	var changed []string
	for _, n := range nodes {
		if heldKey(held[n]) != s.heldSeen[n] {
			changed = append(changed, n)
		}
	}
	s.mu.Unlock()
	slices.Sort(changed)
	for _, n := range changed {
		gpus := held[n]
		if gpus == nil {
			gpus = []events.HeldGPU{}
		}
		if _, err := s.bus.Publish(ctx, &events.TopologyHeld{Node: n, GPUs: gpus, ObservedAt: time.Now().UTC()}); err != nil {
			s.log.Warn("slurm: publish held GPUs", "node", n, "err", err)
			continue // tried again at the next poll
		}
		s.log.Debug("slurm: held GPUs published", "node", n, "gpus", heldKey(gpus))
		s.mu.Lock()
		s.heldSeen[n] = heldKey(gpus)
		s.mu.Unlock()
	}
}

// syncJobs finishes the toposched jobs whose Slurm job ended and reports
// those Slurm runs elsewhere than decided.
func (s *Service) syncJobs(ctx context.Context, jobs []Job) {
	present := map[string]Job{}
	for _, j := range jobs {
		// A placeholder ends when the job is decided (topoctl cancels it
		// before srun) or cancelled (topoctl finishes the job itself):
		// either way its end is not the job's.
		if j.ToposchedJob == "" || j.Placeholder {
			continue
		}
		// A requeued or resubmitted job: the newest Slurm job speaks.
		if p, ok := present[j.ToposchedJob]; !ok || j.ID > p.ID {
			present[j.ToposchedJob] = j
		}
	}
	for id, j := range present {
		s.seen[id] = j
		if status, ok := endStatus(j.State); ok {
			s.finish(ctx, id, status, fmt.Sprintf("slurm job %d ended %s", j.ID, j.State))
			continue
		}
		if holding(j.State) {
			s.check(id, j)
		}
	}
	for id, j := range s.seen {
		if _, ok := present[id]; ok {
			continue
		}
		// Gone from the queue before a poll saw how it ended (Slurm
		// forgets a job MinJobAge after its end).
		if s.finish(ctx, id, events.StatusLost, fmt.Sprintf("slurm job %d left the queue (last seen %s)", j.ID, j.State)) {
			delete(s.seen, id)
			delete(s.reported, id)
		}
	}
}

// finish publishes jobs.finished for a toposched job the streams show
// decided and not finished, and reports whether nothing is left to do
// (published, or not the service's to finish).
func (s *Service) finish(ctx context.Context, id string, status events.JobStatus, msg string) bool {
	s.mu.Lock()
	d := s.decided[id]
	s.mu.Unlock()
	if d == nil {
		return true
	}
	if _, err := s.bus.Publish(ctx, &events.JobFinished{JobID: id, Status: status, Message: msg}); err != nil {
		s.log.Warn("slurm: finish job", "job", id, "err", err)
		return false
	}
	s.met.jobFinished()
	s.log.Info("slurm: job finished", "job", id, "status", status, "why", msg)
	s.mu.Lock()
	delete(s.decided, id)
	s.ended[id] = true
	s.mu.Unlock()
	return true
}

// check reports, once per job, a toposched job Slurm runs on other nodes
// or GPUs than placement decided. It is not stopped: Slurm has started
// it, and only its owner knows whether the ranks care.
func (s *Service) check(id string, j Job) {
	s.mu.Lock()
	d := s.decided[id]
	s.mu.Unlock()
	if d == nil || s.reported[id] {
		return
	}
	if diff := mismatch(d, j); diff != "" {
		s.reported[id] = true
		s.met.mismatched()
		s.log.Warn("slurm: job runs elsewhere than decided", "job", id, "slurm_job", j.ID, "diff", diff)
	}
}
