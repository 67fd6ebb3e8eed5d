package main

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
)

// defaultTuningWait is how long the Slurm launch waits for the decision's
// runtime.tuning: the node agents' own wait (launcher.DefaultTuningWait,
// which TestDefaultTuningWaitIsTheAgents' compares).
const defaultTuningWait = 3 * time.Second

// maxArgBytes is the most bytes one argument of a program may have on
// Linux (MAX_ARG_STRLEN, 32 pages, its terminating NUL included): srun's
// arguments, the rank wrapper's script among them, must each fit.
const maxArgBytes = 32*4096 - 1

// tuningFollower keeps the runtime.tuning events of one job as a follower
// reads them, for a launch to wait on the one of its decision.
type tuningFollower struct {
	job string

	mu  sync.Mutex
	got []*events.RuntimeTuning
	// more is closed, and replaced, at each event kept.
	more chan struct{}
	err  error
	done bool
}

func newTuningFollower(job string) *tuningFollower {
	return &tuningFollower{job: job, more: make(chan struct{})}
}

// record is a bus follower's callback: it keeps the job's tunings.
func (f *tuningFollower) record(b *bus.Bus) func(bus.Record) error {
	return func(r bus.Record) error {
		if r.Env.Subject != f.job {
			return nil
		}
		var t events.RuntimeTuning
		// One that does not decode is the optimizer's to dead-letter.
		if b.Decode(r.Name, r.Body, &t) != nil || t.JobID != f.job {
			return nil
		}
		f.mu.Lock()
		f.got = append(f.got, &t)
		close(f.more)
		f.more = make(chan struct{})
		f.mu.Unlock()
		return nil
	}
}

// end records that the follower stopped, with its error.
func (f *tuningFollower) end(err error) {
	f.mu.Lock()
	f.err, f.done = err, true
	close(f.more)
	f.more = make(chan struct{})
	f.mu.Unlock()
}

// find returns the last tuning of the decision made at decidedAt, a
// channel closed at the next event, and whether the follower has ended,
// with its error.
func (f *tuningFollower) find(decidedAt time.Time) (*events.RuntimeTuning, <-chan struct{}, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.got) - 1; i >= 0; i-- {
		if f.got[i].DecidedAt.Equal(decidedAt) {
			return f.got[i], f.more, f.done, f.err
		}
	}
	return nil, f.more, f.done, f.err
}

// wait waits up to wait for the tuning of the decision d: nil when none
// came (or the follower ended without one), an error only when ctx ended.
func (f *tuningFollower) wait(ctx context.Context, d *events.PlacementDecided, wait time.Duration) (*events.RuntimeTuning, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		t, more, done, _ := f.find(d.DecidedAt)
		if t != nil || done {
			return t, nil
		}
		select {
		case <-more:
		case <-timer.C:
			t, _, _, _ = f.find(d.DecidedAt)
			return t, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// readTuning reads the stored runtime.tuning of decision d, and if none
// is stored yet, follows the stream for it up to wait, as the node agents
// do. nil: none came.
func readTuning(ctx context.Context, b *bus.Bus, d *events.PlacementDecided, wait time.Duration) (*events.RuntimeTuning, error) {
	f := newTuningFollower(d.JobID)
	subjects := []string{b.Subjects.Of(events.NameRuntimeTuning)}
	var last uint64
	rec := f.record(b)
	err := b.Replay(ctx, events.DomainRuntime, subjects, func(r bus.Record) error {
		last = r.Seq
		return rec(r)
	})
	if err != nil {
		return nil, fmt.Errorf("read runtime.tuning: %w", err)
	}
	if t, _, _, _ := f.find(d.DecidedAt); t != nil || wait <= 0 {
		return t, nil
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ended := make(chan struct{})
	go func() {
		f.end(b.FollowFrom(fctx, events.DomainRuntime, subjects, last, nil, rec))
		close(ended)
	}()
	t, err := f.wait(ctx, d, wait)
	cancel()
	<-ended
	if t == nil && err == nil {
		if _, _, _, ferr := f.find(d.DecidedAt); ferr != nil {
			return nil, fmt.Errorf("follow runtime.tuning: %w", ferr)
		}
	}
	return t, err
}

// slurmTuned is a runtime.tuning as the Slurm ranks of one decision get
// it, in the agents' order: All, then the rank's node's, then the rank's
// own, each overriding the one before; the job's env and the decision's
// own variables override them all.
type slurmTuned struct {
	// exports are All's variables that srun --export can pass.
	exports []string
	// all are All's variables it cannot (a comma in the value: the
	// per-collective NCCL_ALGO "allreduce:ring,tree"; a value naming a
	// file): NAME=value, set by the rank wrapper.
	all []string
	// nodes is each node's part of the wrapper's script: its files
	// written, its variables set; ranks each rank's variables.
	nodes map[string]string
	ranks map[int]string
	// files is how many tuning files each node writes.
	files map[string]int
}

// slurmReserved are the variables the Slurm launch sets from the
// decision: they win over the tuning, as with the agents.
var slurmReserved = []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}

// tuningVarName is a variable the rank wrapper can set. toposched_* are
// the wrapper's own (the tuning files' paths).
var tuningVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// wrapperFile is the wrapper's variable holding a node's i-th tuning
// file's path.
func wrapperFile(i int) string { return "toposched_f" + strconv.Itoa(i) }

// slurmTuning works out what the tuning t gives the ranks of d, whose
// job sets jobEnv (NAME=value): names the job's env or the decision sets
// are left out. Files are written on a node only where a variable names
// them; their content, like every value, is quoted for the shell.
func slurmTuning(d *events.PlacementDecided, t *events.RuntimeTuning, jobEnv []string) (*slurmTuned, error) {
	tuned := &slurmTuned{nodes: map[string]string{}, ranks: map[int]string{}, files: map[string]int{}}
	if t == nil {
		return tuned, nil
	}
	skip := map[string]bool{}
	for _, n := range slurmReserved {
		skip[n] = true
	}
	for _, kv := range jobEnv {
		name, _, _ := strings.Cut(kv, "=")
		skip[name] = true
	}
	// keep drops the skipped names and checks the others: a name or a
	// value the shell or argv cannot carry is refused, naming it.
	keep := func(scope string, env map[string]string) (map[string]string, error) {
		out := map[string]string{}
		for _, name := range slices.Sorted(maps.Keys(env)) {
			if skip[name] {
				continue
			}
			if !tuningVarName.MatchString(name) || strings.HasPrefix(name, "toposched_") {
				return nil, fmt.Errorf("runtime.tuning env %s %q: not a variable name the rank wrapper can set", scope, name)
			}
			if strings.ContainsRune(env[name], 0) {
				return nil, fmt.Errorf("runtime.tuning env %s %s: a NUL byte cannot pass to a process", scope, name)
			}
			out[name] = env[name]
		}
		return out, nil
	}
	all, err := keep("all", t.Env.All)
	if err != nil {
		return nil, err
	}
	// Each node's files by the path the event names (the last of a
	// path wins, as with the agents).
	files := map[string]map[string]string{}
	for _, f := range t.Files {
		if strings.ContainsRune(f.Content, 0) {
			return nil, fmt.Errorf("runtime.tuning file %s of node %s: a NUL byte cannot pass through the rank wrapper", f.Path, f.Node)
		}
		if files[f.Node] == nil {
			files[f.Node] = map[string]string{}
		}
		files[f.Node][f.Path] = f.Content
	}
	namesFile := func(v string) bool {
		for _, fs := range files {
			if _, ok := fs[v]; ok {
				return true
			}
		}
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(all)) {
		v := all[name]
		if strings.Contains(v, ",") || namesFile(v) {
			tuned.all = append(tuned.all, name+"="+v)
		} else {
			tuned.exports = append(tuned.exports, name+"="+v)
		}
	}
	byNode := map[string][]events.RankPlacement{}
	for _, r := range d.Ranks {
		byNode[r.Node] = append(byNode[r.Node], r)
	}
	for _, np := range d.Nodes {
		nodeEnv, err := keep("nodes."+np.Node, t.Env.Nodes[np.Node])
		if err != nil {
			return nil, err
		}
		rankEnv := map[int]map[string]string{}
		for _, r := range byNode[np.Node] {
			if rankEnv[r.Rank], err = keep("ranks."+strconv.Itoa(r.Rank), t.Env.Ranks[strconv.Itoa(r.Rank)]); err != nil {
				return nil, err
			}
		}
		// The node's files some variable of its ranks names, in path
		// order, each in a fresh temp file of the wrapper's.
		used := map[string]bool{}
		for _, env := range append([]map[string]string{all, nodeEnv}, slices.Collect(maps.Values(rankEnv))...) {
			for _, v := range env {
				if _, ok := files[np.Node][v]; ok {
					used[v] = true
				}
			}
		}
		paths := slices.Sorted(maps.Keys(used))
		tuned.files[np.Node] = len(paths)
		value := func(v string) string {
			if i := slices.Index(paths, v); i >= 0 {
				return `"$` + wrapperFile(i) + `"`
			}
			return shellQuote(v)
		}
		var body []string
		for i, p := range paths {
			// The wrapper's variable names the file from mktemp on;
			// a failed write is the rank's failure, said on its stderr.
			body = append(body, fmt.Sprintf(`%s=$(mktemp "${TMPDIR:-/tmp}/toposched-tuning.XXXXXXXXXX") && printf %%s %s >"$%[1]s" || { printf 'toposched: node %%s: cannot write the tuning file %%s\n' "$SLURMD_NODENAME" %[3]s >&2; exit 1; }`,
				wrapperFile(i), shellQuote(files[np.Node][p]), shellQuote(p)))
		}
		// All's variables naming one of the node's files point at its
		// copy; the node's own override All's.
		exports := map[string]string{}
		for name, v := range all {
			if slices.Contains(paths, v) {
				exports[name] = value(v)
			}
		}
		for name, v := range nodeEnv {
			exports[name] = value(v)
		}
		if len(exports) > 0 {
			body = append(body, "export "+assignments(exports))
		}
		if len(body) > 0 {
			tuned.nodes[np.Node] = strings.Join(body, "; ")
		}
		for rank, env := range rankEnv {
			if len(env) == 0 {
				continue
			}
			exports := map[string]string{}
			for name, v := range env {
				exports[name] = value(v)
			}
			tuned.ranks[rank] = "export " + assignments(exports)
		}
	}
	return tuned, nil
}

// assignments is NAME=value words in name order, the values already
// quoted for the shell.
func assignments(env map[string]string) string {
	var words []string
	for _, name := range slices.Sorted(maps.Keys(env)) {
		words = append(words, name+"="+env[name])
	}
	return strings.Join(words, " ")
}

// script is the part of the rank wrapper that applies the tuning to the
// ranks of nodes, once RANK is set; "" when the tuning gives them nothing.
// With files it first arranges their removal however the wrapper ends.
func (t *slurmTuned) script(nodes []string, ranks []int) string {
	var parts []string
	if len(t.all) > 0 {
		env := map[string]string{}
		for _, kv := range t.all {
			name, v, _ := strings.Cut(kv, "=")
			env[name] = shellQuote(v)
		}
		parts = append(parts, "export "+assignments(env))
	}
	// Nodes of the same part share a case branch.
	var bodies []string
	patterns := map[string][]string{}
	for _, n := range nodes {
		b, ok := t.nodes[n]
		if !ok {
			continue
		}
		if _, seen := patterns[b]; !seen {
			bodies = append(bodies, b)
		}
		patterns[b] = append(patterns[b], shellQuote(n))
	}
	if len(bodies) > 0 {
		var arms []string
		for _, b := range bodies {
			arms = append(arms, strings.Join(patterns[b], "|")+") "+b+";;")
		}
		parts = append(parts, `case "$SLURMD_NODENAME" in `+strings.Join(arms, " ")+" esac")
	}
	var arms []string
	for _, r := range ranks {
		if b, ok := t.ranks[r]; ok {
			arms = append(arms, strconv.Itoa(r)+") "+b+";;")
		}
	}
	if len(arms) > 0 {
		parts = append(parts, `case "$RANK" in `+strings.Join(arms, " ")+" esac")
	}
	if len(parts) == 0 {
		return ""
	}
	if n := t.filesOn(nodes); n > 0 {
		// The files go when the wrapper exits, also on the SIGTERM
		// with which Slurm stops a step (its trap runs once the rank,
		// signalled too, has exited). The variables are cleared first:
		// one inherited from the environment must never be removed.
		vars := make([]string, n)
		quoted := make([]string, n)
		for i := range n {
			vars[i] = wrapperFile(i)
			quoted[i] = "${" + wrapperFile(i) + `:+"$` + wrapperFile(i) + `"}`
		}
		parts = append([]string{"unset " + strings.Join(vars, " "),
			"trap 'rm -f -- " + strings.Join(quoted, " ") + "' EXIT",
			"trap 'exit 129' HUP", "trap 'exit 130' INT", "trap 'exit 143' TERM"}, parts...)
	}
	return strings.Join(parts, "; ")
}

// filesOn reports how many tuning files the wrapper writes at most on
// one of nodes.
func (t *slurmTuned) filesOn(nodes []string) int {
	n := 0
	for _, node := range nodes {
		n = max(n, t.files[node])
	}
	return n
}
