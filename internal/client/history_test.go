package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
)

func decision(jobID string, nodes, perNode int) *events.PlacementDecided {
	d := &events.PlacementDecided{JobID: jobID, Strategy: "topology-aware", DecidedAt: time.Date(2025, 1, 2, 10, 0, 0, 0, time.UTC)}
	for n := range nodes {
		node := fmt.Sprintf("dgx-%03d", n+1)
		np := events.NodePlacement{Node: node, CUDAVisibleDevices: "0,1,2,3,4,5,6,7"[:2*perNode-1]}
		for g := range perNode {
			np.GPUs = append(np.GPUs, g)
			d.Ranks = append(d.Ranks, events.RankPlacement{Rank: n*perNode + g, Node: node, GPU: g, LocalRank: g})
		}
		d.Nodes = append(d.Nodes, np)
	}
	return d
}

func submission(jobID string) *events.JobSubmitted {
	return &events.JobSubmitted{JobID: jobID, GPUs: 8, Parallelism: &events.Parallelism{TP: 8}}
}

func publish(t testing.TB, ctx context.Context, b *bus.Bus, vs ...any) {
	t.Helper()
	for _, v := range vs {
		if _, err := b.Publish(ctx, v); err != nil {
			t.Fatalf("publish %T: %v", v, err)
		}
	}
}

func names(h *JobHistory) []events.Name {
	var ns []events.Name
	for _, e := range h.Events {
		ns = append(ns, e.Name)
	}
	return ns
}

func TestHistory(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "history-test")
	ctx := eventstest.Context(t, 30*time.Second)

	// An unknown job, on streams that exist but are empty.
	if _, err := History(ctx, b, "nobody"); !errors.Is(err, ErrUnknownJob) || err.Error() != "no events for job nobody on toposched" {
		t.Fatalf("empty streams: %v", err)
	}

	// The job waits many times while other jobs come and go around it,
	// is decided, then finished.
	publish(t, ctx, b, submission("target"), submission("other-0"))
	const waits = 150
	for i := range waits {
		other := fmt.Sprintf("other-%d", i)
		publish(t, ctx, b,
			&events.PlacementPending{JobID: "target", Reasons: []events.Reason{{Code: "insufficient_free_gpus", Message: fmt.Sprintf("wait %d", i)}}},
			decision(other, 1, 8),
			&events.JobFinished{JobID: other, Status: events.StatusSucceeded},
			&events.PlacementReleased{JobID: other, Status: events.StatusSucceeded},
			submission(fmt.Sprintf("other-%d", i+1)),
		)
	}
	// A message published by hand, without CloudEvents headers: the job id
	// comes from the body. Another with the header in another case.
	raw := func(subject string, h nats.Header, body string) {
		t.Helper()
		m := nats.NewMsg(subject)
		m.Header, m.Data = h, []byte(body)
		if _, err := b.JetStream().PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	raw("toposched.jobs.submitted", nil, `{"job_id":"target","gpus":8}`)
	raw("toposched.jobs.submitted", nats.Header{"Ce-Subject": {"target"}}, `{"job_id":"target","gpus":8}`)
	raw("toposched.jobs.submitted", nats.Header{"Ce-Subject": {"other-x"}}, `{"job_id":"target","gpus":8}`)
	publish(t, ctx, b, decision("target", 2, 8), &events.JobFinished{JobID: "target", Status: events.StatusFailed},
		&events.PlacementReleased{JobID: "target", Status: events.StatusFailed})

	h, err := History(ctx, b, "target")
	if err != nil {
		t.Fatal(err)
	}
	want := []events.Name{events.NameJobSubmitted}
	for range waits {
		want = append(want, events.NamePlacementPending)
	}
	want = append(want, events.NameJobSubmitted, events.NameJobSubmitted,
		events.NamePlacementDecided, events.NameJobFinished, events.NamePlacementReleased)
	if got := names(h); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	for i, e := range h.Events {
		if e.Data == nil || e.Error != "" || events.KeyOf(e.Data) != "target" {
			t.Fatalf("event %d: %+v", i, e)
		}
		if i > 0 && e.Stored.Before(h.Events[i-1].Stored) {
			t.Fatalf("event %d stored before its predecessor", i)
		}
	}
	if p := h.Events[waits].Data.(*events.PlacementPending); p.Reasons[0].Message != fmt.Sprintf("wait %d", waits-1) {
		t.Errorf("last wait %+v", p)
	}
	if h.State != StateFinished || h.Status != events.StatusFailed || !h.Since.Equal(h.Events[len(h.Events)-2].Time) {
		t.Errorf("state %s %s since %v", h.State, h.Status, h.Since)
	}
	if o := h.LastOutcome(); o == nil || o.Name != events.NamePlacementDecided {
		t.Errorf("last outcome %+v", o)
	}
	// Reading leaves no consumer behind.
	for _, d := range historyDomains {
		s, err := b.JetStream().Stream(ctx, b.StreamName(d))
		if err != nil {
			t.Fatal(err)
		}
		if n := s.CachedInfo().State.Consumers; n != 0 {
			t.Errorf("stream %s: %d consumers left", d, n)
		}
	}

	// Another job's history holds only its own events.
	h, err = History(ctx, b, "other-7")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(names(h)); got != "[jobs.submitted placement.decided jobs.finished placement.released]" {
		t.Errorf("other-7: %s", got)
	}

	// JSON round trip keeps the typed data.
	data, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var back JobHistory
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if d, ok := back.Events[1].Data.(*events.PlacementDecided); !ok || d.JobID != "other-7" || back.State != StateFinished {
		t.Errorf("round trip: %+v", back.Events[1])
	}

	// A cancelled context ends the reading with its error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := History(cctx, b, "target"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

// TestHistoryNoStreams: before any service created the streams, a job is
// simply unknown.
func TestHistoryNoStreams(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	ctx := eventstest.Context(t, 30*time.Second)
	b, err := bus.Connect(ctx, bus.Config{URL: srv.ClientURL(), Prefix: "elsewhere", SkipStreams: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	if _, err := History(ctx, b, "j"); err == nil || err.Error() != "no events for job j on elsewhere" {
		t.Fatalf("no streams: %v", err)
	}
}

// brokenBody stands for an event whose body breaks its schema.
type brokenBody struct{ v any }

func invalid(v any) brokenBody { return brokenBody{v} }

func TestSettle(t *testing.T) {
	t.Parallel()
	at := func(m int) time.Time { return time.Date(2025, 1, 2, 10, m, 0, 0, time.UTC) }
	sub := submission("j")
	an := &events.JobAnalyzed{Job: *sub}
	pend := &events.PlacementPending{JobID: "j"}
	dec := decision("j", 1, 8)
	rej := &events.PlacementRejected{JobID: "j"}
	fin := &events.JobFinished{JobID: "j", Status: events.StatusCancelled}
	rel := &events.PlacementReleased{JobID: "j", Status: events.StatusCancelled}
	tests := []struct {
		name    string
		evs     []any
		state   string
		status  events.JobStatus
		since   int // minute of the event that set the state
		ignored []int
	}{
		{"submitted", []any{sub}, StateSubmitted, "", 0, nil},
		{"analyzed", []any{sub, an}, StateAnalyzed, "", 1, nil},
		{"pending", []any{sub, an, pend, pend}, StatePending, "", 2, nil},
		{"decided after waiting", []any{sub, an, pend, dec}, StateDecided, "", 3, nil},
		{"duplicate submission ignored", []any{sub, an, dec, sub, an}, StateDecided, "", 2, []int{3, 4}},
		{"rejected", []any{sub, an, rej}, StateRejected, "", 2, nil},
		{"resubmitted after rejection", []any{sub, an, rej, sub}, StateSubmitted, "", 3, nil},
		{"finish of a rejected job ignored", []any{sub, rej, fin}, StateRejected, "", 1, []int{2}},
		{"finished", []any{sub, an, dec, fin, rel}, StateFinished, events.StatusCancelled, 3, nil},
		{"withdrawn while pending", []any{sub, an, pend, fin, rel}, StateFinished, events.StatusCancelled, 3, nil},
		{"released without its finish", []any{sub, an, dec, rel}, StateFinished, events.StatusCancelled, 3, nil},
		// Placement withdraws a job finished before it was analysed: the
		// analysis that comes after is the ignored one, and no decision
		// follows.
		{"finish before placement knew the job", []any{sub, fin, rel, an}, StateFinished, events.StatusCancelled, 1, []int{3}},
		// The finish at 3 (event id e3) was refused: nothing changed.
		{"finish refused", []any{sub, an, dec, fin, &events.PlacementFinishRefused{JobID: "j", RequestID: "e3"}},
			StateDecided, "", 2, []int{3}},
		{"finish that breaks its schema", []any{sub, an, dec, invalid(fin)}, StateDecided, "", 2, []int{3}},
		// The job's own finish after a refused one counts (the refused one
		// used to read finished, and topoctl finish by the job's own
		// tenant then sent nothing).
		{"finished after a refused finish", []any{sub, an, dec, fin, &events.PlacementFinishRefused{JobID: "j", RequestID: "e3"}, fin, rel},
			StateFinished, events.StatusCancelled, 5, []int{3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := &JobHistory{JobID: "j"}
			for i, v := range tc.evs {
				e := HistoryEvent{ID: fmt.Sprintf("e%d", i), Time: at(i), Data: v}
				if bad, ok := v.(brokenBody); ok {
					e.Data, e.Invalid = bad.v, "status: enum: value must be one of ..."
				}
				e.Name, _ = events.NameOf(e.Data)
				h.Events = append(h.Events, e)
			}
			h.settle()
			var ignored []int
			for i, e := range h.Events {
				if e.Ignored {
					ignored = append(ignored, i)
				}
			}
			if fmt.Sprint(ignored) != fmt.Sprint(tc.ignored) {
				t.Errorf("ignored events %v, want %v", ignored, tc.ignored)
			}
			if h.State != tc.state || h.Status != tc.status || !h.Since.Equal(at(tc.since)) {
				t.Errorf("got %s %q since %v; want %s %q since %v", h.State, h.Status, h.Since, tc.state, tc.status, at(tc.since))
			}
		})
	}
}

// BenchmarkHistory reads one job's events out of 20,500 stored events:
// 5,000 jobs each submitted, analyzed, decided and released (decisions of
// 16 ranks on 2 nodes with NCCL topology XML, about 6.5 kB as real ones),
// among them a job that waited 500 times.
func BenchmarkHistory(b *testing.B) {
	srv := eventstest.Server(b)
	bs := eventstest.Bus(b, srv.ClientURL(), "history-bench")
	ctx := eventstest.Context(b, 5*time.Minute)
	js := bs.JetStream()
	const jobs, waits = 5000, 500
	xml := strings.Repeat(`<gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:07:00.0" count="12" tclass="0x068000"/></gpu>`, 24)
	send := func(v any) {
		name, _ := events.NameOf(v)
		key := events.KeyOf(v)
		body, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		m := nats.NewMsg(bs.Subjects.Of(name))
		for k, v := range bs.Envelope(ctx, name, key).Headers() {
			m.Header.Set(k, v)
		}
		m.Data = body
		if _, err := js.PublishMsgAsync(m); err != nil {
			b.Fatal(err)
		}
	}
	for i := range jobs {
		id := fmt.Sprintf("job-%05d", i)
		sub := submission(id)
		send(sub)
		send(&events.JobAnalyzed{Job: *sub, Parallelism: events.Parallelism{TP: 8, DP: 2}, Order: []string{"tp", "dp"}})
		d := decision(id, 2, 8)
		for n := range d.Nodes {
			d.Nodes[n].NCCLTopoXML = xml
		}
		send(d)
		send(&events.PlacementReleased{JobID: id, Status: events.StatusSucceeded})
		if i%(jobs/waits) == 0 {
			send(&events.PlacementPending{JobID: "waiter", Reasons: []events.Reason{{Code: "insufficient_free_gpus", Message: "needs 64"}}})
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		b.Fatal("publishing the events timed out")
	}
	for _, tc := range []struct {
		job  string
		want int
	}{{"job-02500", 4}, {"waiter", waits}} {
		b.Run(fmt.Sprintf("%d-events", tc.want), func(b *testing.B) {
			for b.Loop() {
				h, err := History(ctx, bs, tc.job)
				if err != nil {
					b.Fatal(err)
				}
				if len(h.Events) != tc.want {
					b.Fatalf("%d events", len(h.Events))
				}
			}
		})
	}
}

// The job explain shows is the submission placement took, not a later
// resubmission it ignored (a job holding 1 GPU was shown with the 8 of an
// ignored resubmission).
func TestSubmissionSkipsIgnoredResubmission(t *testing.T) {
	t.Parallel()
	first := &events.JobSubmitted{JobID: "j", GPUs: 1}
	again := &events.JobSubmitted{JobID: "j", GPUs: 8}
	h := &JobHistory{JobID: "j"}
	for _, v := range []any{first, &events.PlacementDecided{JobID: "j"}, again} {
		name, _ := events.NameOf(v)
		h.Events = append(h.Events, HistoryEvent{Name: name, Data: v})
	}
	h.settle()
	if got := h.Submission(); got == nil || got.GPUs != 1 {
		t.Fatalf("submission %+v, want the first (1 GPU)", got)
	}
}

// A job submitted as hundreds of thousands of numbers (issue 46: explain
// ran for minutes) has its submission summarised, not decoded: its size,
// SHA-256, first bytes and why it breaks the schema, beside the rejection;
// reading the history costs little more than the body itself. A small
// malformed submission is still decoded as far as it goes.
func TestHistoryOfAHugeSubmission(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "history-test")
	ctx := eventstest.Context(t, 30*time.Second)
	var body strings.Builder
	body.WriteString(`{"job_id":"flood","gpus":1,"args":[`)
	for i := range 400_000 {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteString(strconv.Itoa(i % 10))
	}
	body.WriteString(`]}`)
	m := nats.NewMsg("toposched.jobs.submitted")
	m.Header.Set(events.HeaderSubject, "flood")
	m.Data = []byte(body.String())
	if _, err := b.JetStream().PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, b, &events.PlacementRejected{JobID: "flood", Reasons: []events.Reason{{Code: "schema_type", Field: "args[0]"}}})

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h, err := History(ctx, b, "flood")
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	// The body is fetched (0.8 MB); a document of it would be 160 MB.
	if alloc := (after.TotalAlloc - before.TotalAlloc) >> 20; alloc > 16 {
		t.Errorf("History allocated %d MB", alloc)
	}
	if h.State != StateRejected || len(h.Events) != 2 {
		t.Fatalf("state %s, %d events", h.State, len(h.Events))
	}
	e := h.Events[0]
	sum := sha256.Sum256([]byte(body.String()))
	if e.Data != nil || e.Body == nil || e.Body.Size != body.Len() || e.Body.SHA256 != hex.EncodeToString(sum[:]) ||
		!strings.HasPrefix(body.String(), e.Body.Head) || len(e.Body.Head) == 0 || len(e.Body.Head) > 256 {
		t.Fatalf("submission %+v, want a summary of the %d-byte body", e, body.Len())
	}
	if !strings.HasPrefix(e.Invalid, "args[0]: type") {
		t.Errorf("invalid %q, want the schema's first problem", e.Invalid)
	}

	// A small malformed submission is decoded as far as it goes.
	publish(t, ctx, b, &events.PlacementRejected{JobID: "small", Reasons: []events.Reason{{Code: "schema_minimum", Field: "gpus"}}})
	raw := nats.NewMsg("toposched.jobs.submitted")
	raw.Data = []byte(`{"job_id":"small","gpus":0}`)
	if _, err := b.JetStream().PublishMsg(ctx, raw); err != nil {
		t.Fatal(err)
	}
	h, err = History(ctx, b, "small")
	if err != nil {
		t.Fatal(err)
	}
	var sub *HistoryEvent
	for i := range h.Events {
		if h.Events[i].Name == events.NameJobSubmitted {
			sub = &h.Events[i]
		}
	}
	if sub == nil || sub.Body != nil || sub.Data == nil || !strings.Contains(sub.Invalid, "gpus") {
		t.Fatalf("small submission %+v, want it decoded with why it is invalid", sub)
	}
}
