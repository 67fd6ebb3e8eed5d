package e2e

// The chaos soak's view of the placement log: the reader and follower of the
// placement stream, the checker of its invariants as it grows, its snapshot,
// and the dump of the log on failure.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// chaosMsg is one message of the placement stream, term markers included.
type chaosMsg struct {
	seq     uint64
	subject string
	at      time.Time // when the stream stored it
	header  nats.Header
	data    []byte
	jobID   string
}

// chaosReader reads the placement stream by sequence, from the start, and
// tolerates a cluster in the middle of a fault: a read that fails is taken
// up again on the next call.
type chaosReader struct {
	js   jetstream.JetStream
	msgs []chaosMsg
}

// readMore reads what was stored since the last call, and returns it.
func (r *chaosReader) readMore(ctx context.Context) ([]chaosMsg, error) {
	s, err := r.js.Stream(ctx, streamPlacement)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, err
	}
	if info.State.FirstSeq > 1 {
		return nil, fmt.Errorf("%s starts at #%d: messages lost", streamPlacement, info.State.FirstSeq)
	}
	var got []chaosMsg
	for seq := uint64(len(r.msgs)) + 1; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			// The stream deletes nothing: a message not found below
			// the last sequence is one not yet readable, or lost.
			return got, fmt.Errorf("get #%d of %d: %w", seq, info.State.LastSeq, err)
		}
		cm := chaosMsg{seq: seq, subject: m.Subject, at: m.Time, header: m.Header, data: m.Data}
		if m.Subject != subjectTerm {
			var probe struct {
				JobID string `json:"job_id"`
			}
			_ = json.Unmarshal(m.Data, &probe) // a body that is not JSON is the checker's to report
			cm.jobID = probe.JobID
		}
		r.msgs = append(r.msgs, cm)
		got = append(got, cm)
	}
	return got, nil
}

// chaosLog follows the placement stream as it grows and checks each
// message as it comes (chaosChecker).
type chaosLog struct {
	mu       sync.Mutex
	r        chaosReader
	c        *chaosChecker
	lastErr  error
	reported int // violations already reported with t.Errorf
	onEvent  func(chaosMsg)

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// follow reads the stream every 100 ms until stopFollow.
func (l *chaosLog) follow() {
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-tick.C:
				_ = l.sync() // kept in lastErr, shown by status
			}
		}
	}()
}

func (l *chaosLog) stopFollow() {
	l.stopOnce.Do(func() {
		if l.stop != nil {
			close(l.stop)
			<-l.done
		}
	})
}

// sync reads and checks what was stored since the last call, then tells
// onEvent about each message.
func (l *chaosLog) sync() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.mu.Lock()
	got, err := l.r.readMore(ctx)
	for _, m := range got {
		l.c.apply(m)
	}
	l.lastErr = err
	l.mu.Unlock()
	if l.onEvent != nil {
		for _, m := range got {
			l.onEvent(m)
		}
	}
	return err
}

// chaosSnapshot is the log's state at one point.
type chaosSnapshot struct {
	seq                                       uint64
	free, placed, pending, rejected, finished int
	fits                                      []string // waiting jobs that fit in what is free
}

// syncSnapshot reads the log up to its end and returns its state.
func (l *chaosLog) syncSnapshot() (chaosSnapshot, error) {
	if err := l.sync(); err != nil {
		return chaosSnapshot{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.c
	s := chaosSnapshot{seq: uint64(len(l.r.msgs)), free: c.totalFree(), placed: len(c.live), pending: len(c.pending),
		rejected: len(c.rejected), finished: len(c.released)}
	for id := range c.pending {
		if j, ok := c.spec(id); ok && c.fits(j) {
			s.fits = append(s.fits, id)
		}
	}
	slices.Sort(s.fits)
	return s, nil
}

// status is a line on the log for a wait's message.
func (l *chaosLog) status() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	cnt := map[string]int{}
	for _, m := range l.r.msgs {
		cnt[strings.TrimPrefix(m.subject, "toposched.placement.")]++
	}
	s := fmt.Sprintf("placement log at #%d %v", len(l.r.msgs), cnt)
	if l.lastErr != nil {
		s += fmt.Sprintf(" (last read: %v)", l.lastErr)
	}
	return s
}

// progressAfter is the first decision or pending of a launcher's job
// stored after t.
func (l *chaosLog) progressAfter(t time.Time) (chaosMsg, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.r.msgs {
		if m.at.After(t) && (m.subject == subjectDecided || m.subject == subjectPending) && !strings.HasPrefix(m.jobID, chaosProbePrefix) {
			return m, true
		}
	}
	return chaosMsg{}, false
}

// markerAfter is holder's first term marker stored after t.
func (l *chaosLog) markerAfter(holder string, t time.Time) (chaosMarker, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.c.markers {
		if m.holder == holder && m.at.After(t) {
			return m, true
		}
	}
	return chaosMarker{}, false
}

// outcomeOf is the first decision, pending or rejection of job.
func (l *chaosLog) outcomeOf(job string) (chaosMsg, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.r.msgs {
		if m.jobID == job && (m.subject == subjectDecided || m.subject == subjectPending || m.subject == subjectRejected) {
			return m, true
		}
	}
	return chaosMsg{}, false
}

func (l *chaosLog) released(job string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.released[job]
}

func (l *chaosLog) probeFree(job string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.freeAtDecision[job]
}

func (l *chaosLog) violationCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.c.violations)
}

func (l *chaosLog) fences() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.c.fenceSummary()
}

// flush reports the violations found since the last flush.
func (l *chaosLog) flush(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.c.violations[l.reported:] {
		t.Errorf("placement log: %s", v)
	}
	l.reported = len(l.c.violations)
}

// dump logs, for a failed run, the faults, the terms and the end of the log.
func (l *chaosLog) dump(t *testing.T, faults []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "faults: %s\nterms:\n", strings.Join(faults, "; "))
	for _, m := range l.c.markers {
		fmt.Fprintf(&b, "  #%d at %s: %s, lease revision %d, ce-source %s\n", m.seq, m.at.Format("15:04:05.000"), m.holder, m.rev, m.source)
	}
	msgs := l.r.msgs
	if len(msgs) > 400 {
		msgs = msgs[len(msgs)-400:]
	}
	b.WriteString("last messages:\n")
	for _, m := range msgs {
		fmt.Fprintf(&b, "  #%d %s %s %s fence=%s source=%s %.200s\n", m.seq, m.at.Format("15:04:05.000"), m.subject, m.jobID,
			m.header.Get(headerFence), m.header.Get("ce-source"), m.data)
	}
	t.Logf("---- placement log:\n%s", b.String())
}

// chaosMarker is a term marker of the placement stream.
type chaosMarker struct {
	seq    uint64
	at     time.Time
	holder string
	rev    uint64
	source string
}

// chaosChecker applies the placement log one message at a time and records
// every broken invariant.
type chaosChecker struct {
	spec    func(string) (sigkillJob, bool)
	markers []chaosMarker
	// Outcomes stored with and without a fence, and whose ce-source names
	// a replica or not.
	fenced, replicaNamed, replicaUnnamed int
	unfenced                             []uint64
	// others counts outcomes by publishers other than placement
	// (analysis's rejections), by ce-source.
	others map[string]int

	holder         map[gpuKey]string
	live           map[string]decidedJSON
	pending        map[string]bool
	rejected       map[string]bool
	released       map[string]bool
	count          map[string]map[string]int
	freeAtDecision map[string]int
	violations     []string
}

func newChaosChecker(spec func(string) (sigkillJob, bool)) *chaosChecker {
	return &chaosChecker{spec: spec, holder: map[gpuKey]string{}, live: map[string]decidedJSON{}, pending: map[string]bool{},
		rejected: map[string]bool{}, released: map[string]bool{}, count: map[string]map[string]int{}, freeAtDecision: map[string]int{},
		others: map[string]int{}}
}

func (c *chaosChecker) violate(m chaosMsg, format string, args ...any) {
	c.violations = append(c.violations, fmt.Sprintf("#%d %s %s: ", m.seq, strings.TrimPrefix(m.subject, "toposched."), m.jobID)+
		fmt.Sprintf(format, args...))
}

// replicaOf is the replica a message's ce-source names, if any.
func replicaOf(h nats.Header) string {
	if r, ok := strings.CutPrefix(h.Get("ce-source"), placementSource+":"); ok {
		return r
	}
	return ""
}

func (c *chaosChecker) freeByNode() map[string]int {
	free := map[string]int{}
	for i := 1; i <= chaosNodes; i++ {
		free[fmt.Sprintf("gpu-%03d", i)] = chaosPerNode
	}
	for g := range c.holder {
		free[g.node]--
	}
	return free
}

func (c *chaosChecker) totalFree() int {
	return chaosNodes*chaosPerNode - len(c.holder)
}

// fits says whether the log has room for j now.
func (c *chaosChecker) fits(j sigkillJob) bool {
	if j.impossible {
		return false
	}
	if j.GPUsPerNode == 0 {
		return j.GPUs <= c.totalFree()
	}
	roomy := 0
	for _, n := range c.freeByNode() {
		if n >= j.GPUsPerNode {
			roomy++
		}
	}
	return roomy >= j.GPUs/j.GPUsPerNode
}

func (c *chaosChecker) apply(m chaosMsg) {
	if m.subject == subjectTerm {
		var b struct {
			Holder        string `json:"holder"`
			LeaseRevision uint64 `json:"lease_revision"`
		}
		if err := json.Unmarshal(m.data, &b); err != nil || b.Holder == "" {
			c.violate(m, "term marker %q: %v", m.data, err)
			return
		}
		if r := replicaOf(m.header); r != "" && r != b.Holder {
			c.violate(m, "term marker of %s published by %s", b.Holder, r)
		}
		if n := len(c.markers); n > 0 && b.LeaseRevision <= c.markers[n-1].rev {
			c.violate(m, "term of %s on lease revision %d, not above %d of the term before (#%d, %s)",
				b.Holder, b.LeaseRevision, c.markers[n-1].rev, c.markers[n-1].seq, c.markers[n-1].holder)
		}
		c.markers = append(c.markers, chaosMarker{seq: m.seq, at: m.at, holder: b.Holder, rev: b.LeaseRevision,
			source: m.header.Get("ce-source")})
		return
	}
	if !chaosOutcomes[m.subject] {
		return
	}
	// Fencing: the outcome was stored under the last term before it.
	// Analysis rejects an invalid job itself, on placement.rejected,
	// with its own ce-source: not placement's outcome, not fenced.
	if src := m.header.Get("ce-source"); src != "" && src != placementSource && !strings.HasPrefix(src, placementSource+":") {
		c.others[src]++
	} else if len(c.markers) == 0 {
		c.violate(m, "an outcome before any term marker")
	} else {
		cur := c.markers[len(c.markers)-1]
		if f := m.header.Get(headerFence); f != "" {
			c.fenced++
			if f != strconv.FormatUint(cur.seq, 10) {
				by := "no term marker"
				for _, mk := range c.markers {
					if strconv.FormatUint(mk.seq, 10) == f {
						by = "the term marker of " + mk.holder
					}
				}
				c.violate(m, "stored fenced on #%s (%s) while the last term is #%d of %s: an outcome from a replica without the lease",
					f, by, cur.seq, cur.holder)
			}
		} else {
			c.unfenced = append(c.unfenced, m.seq)
		}
		if r := replicaOf(m.header); r != "" {
			c.replicaNamed++
			if r != cur.holder {
				c.violate(m, "published by %s in the term of %s (#%d): an outcome from a replica without the lease", r, cur.holder, cur.seq)
			}
		} else {
			c.replicaUnnamed++
		}
	}
	if m.jobID == "" {
		c.violate(m, "no job_id: %q", m.data)
		return
	}
	if c.count[m.jobID] == nil {
		c.count[m.jobID] = map[string]int{}
	}
	c.count[m.jobID][m.subject]++
	n := c.count[m.jobID][m.subject]
	j, known := c.spec(m.jobID)
	switch m.subject {
	case subjectDecided:
		var d decidedJSON
		if err := json.Unmarshal(m.data, &d); err != nil {
			c.violate(m, "%v", err)
			return
		}
		if n > 1 {
			c.violate(m, "decided %d times", n)
		}
		if c.released[d.JobID] {
			c.violate(m, "decided after its release")
		}
		if c.rejected[d.JobID] {
			c.violate(m, "decided after its rejection")
		}
		if known && len(d.Ranks) != j.GPUs {
			c.violate(m, "%d ranks for %d GPUs", len(d.Ranks), j.GPUs)
		}
		if known && j.GPUsPerNode > 0 {
			for _, nd := range d.Nodes {
				if len(nd.GPUs) != j.GPUsPerNode {
					c.violate(m, "%d GPUs on %s, want %d per node", len(nd.GPUs), nd.Node, j.GPUsPerNode)
				}
			}
		}
		c.freeAtDecision[d.JobID] = c.totalFree()
		free := c.freeByNode()
		for _, g := range d.gpus() {
			if _, ok := free[g.node]; !ok || g.gpu < 0 || g.gpu >= chaosPerNode {
				c.violate(m, "GPU %s/%d is not in the cluster", g.node, g.gpu)
			}
			if other, ok := c.holder[g]; ok {
				c.violate(m, "GPU %s/%d given while %s holds it", g.node, g.gpu, other)
			}
			c.holder[g] = d.JobID
		}
		c.live[d.JobID] = d
		delete(c.pending, d.JobID)
	case subjectPending:
		if n > 1 {
			c.violate(m, "pending %d times", n)
		}
		if _, ok := c.live[m.jobID]; ok {
			c.violate(m, "pending while it holds a decision")
		}
		if known && c.fits(j) {
			c.violate(m, "pending (%d GPUs, %d per node) although the log has room for it: free GPUs per node %v",
				j.GPUs, j.GPUsPerNode, c.freeByNode())
		}
		c.pending[m.jobID] = true
	case subjectRejected:
		if n > 1 {
			c.violate(m, "rejected %d times", n)
		}
		c.rejected[m.jobID] = true
		delete(c.pending, m.jobID)
	case subjectReleased:
		var rel struct {
			Nodes []nodeJSON `json:"nodes"`
		}
		if err := json.Unmarshal(m.data, &rel); err != nil {
			c.violate(m, "%v", err)
			return
		}
		if n > 1 {
			c.violate(m, "released %d times", n)
		}
		var freed []gpuKey
		for _, nd := range rel.Nodes {
			for _, g := range nd.GPUs {
				freed = append(freed, gpuKey{nd.Node, g})
			}
		}
		d, isLive := c.live[m.jobID]
		if isLive {
			held := d.gpus()
			slices.SortFunc(held, cmpGPU)
			slices.SortFunc(freed, cmpGPU)
			if !slices.Equal(held, freed) {
				c.violate(m, "releases %v, the decision holds %v", freed, held)
			}
			for _, g := range held {
				delete(c.holder, g)
			}
		} else if len(freed) > 0 {
			c.violate(m, "releases %v, but the job holds no decision", freed)
		}
		delete(c.live, m.jobID)
		delete(c.pending, m.jobID)
		c.released[m.jobID] = true
	}
}

func cmpGPU(a, b gpuKey) int {
	if a.node != b.node {
		return strings.Compare(a.node, b.node)
	}
	return a.gpu - b.gpu
}

// fenceSummary says how the outcomes were attributed to their terms.
func (c *chaosChecker) fenceSummary() string {
	s := fmt.Sprintf("%d of placement's outcomes fenced on their term's marker, %d without a fence header", c.fenced, len(c.unfenced))
	if c.replicaNamed == 0 {
		s += "; ce-source names no replica (" + placementSource + "), replica attribution by ce-source skipped"
	} else {
		s += fmt.Sprintf("; %d name their replica in ce-source, %d do not", c.replicaNamed, c.replicaUnnamed)
	}
	for src, n := range c.others {
		s += fmt.Sprintf("; %d from %s", n, src)
	}
	return s
}

// finishFences reports, over the whole log, outcomes stored without the
// fence that the others carry: an unconditional publish could come from
// any replica.
func (c *chaosChecker) finishFences(t *testing.T) {
	t.Helper()
	switch {
	case len(c.unfenced) > 0 && c.fenced > 0:
		t.Errorf("placement log: %d outcomes stored without a fence (%s), such as #%v, while %d carry one",
			len(c.unfenced), headerFence, c.unfenced[:min(len(c.unfenced), 10)], c.fenced)
	case len(c.unfenced) > 0:
		t.Logf("note: no outcome carries %s in the stream: the fence is checked by the term order and ce-source only", headerFence)
	}
	if c.replicaNamed > 0 && c.replicaUnnamed > 0 {
		t.Errorf("placement log: %d outcomes name their replica in ce-source, %d do not", c.replicaNamed, c.replicaUnnamed)
	}
}
