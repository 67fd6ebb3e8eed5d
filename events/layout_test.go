package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// TestCompactRoundTrip: over thousands of seeded layouts, a jobs.analyzed
// is written without the members the rest of it gives and read back
// equal to what was written; members that do not follow are kept.
func TestCompactRoundTrip(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...int) int { return xs[rng.IntN(len(xs))] }
	for i := range 3000 {
		p := Parallelism{TP: pick(1, 2, 4, 8), PP: pick(1, 2, 3), CP: pick(1, 2), EP: pick(1, 2, 4)}
		p.DP = p.EP * pick(1, 2, 3, 5)
		gpus := p.TP * p.PP * p.CP * p.DP
		order := append([]string(nil), Dimensions...)
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		a := JobAnalyzed{Job: JobSubmitted{JobID: fmt.Sprintf("j%d", i), GPUs: gpus}, Parallelism: p, Order: order,
			Groups: LayoutGroups(p, order)}
		for g := range rng.IntN(3) {
			ranks := rng.Perm(gpus)[:1+rng.IntN(gpus)]
			name := fmt.Sprintf("g%d", g)
			a.Job.Groups = append(a.Job.Groups, CommGroup{Name: name, Collective: CollectiveAllReduce, Ranks: ranks, Bytes: 1})
			a.Groups = append(a.Groups, RankGroups{Dimension: DimensionCustom, Name: name, Size: len(ranks), Members: [][]int{append([]int(nil), ranks...)}})
		}
		kept := -1
		if len(a.Groups) > 0 && rng.IntN(4) == 0 {
			// Members that are not the layout's: written out.
			kept = rng.IntN(len(a.Groups))
			m := a.Groups[kept].Members
			m[0] = append([]int(nil), m[0]...)
			m[0][0], m[0][len(m[0])-1] = m[0][len(m[0])-1], m[0][0]
			if len(m[0]) == 1 {
				kept = -1
			}
		}
		body, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var wire struct {
			Groups []map[string]json.RawMessage `json:"groups"`
		}
		if err := json.Unmarshal(body, &wire); err != nil {
			t.Fatal(err)
		}
		for g, w := range wire.Groups {
			if _, listed := w["members"]; listed != (g == kept) {
				t.Fatalf("%s: groups[%d] members listed %v, want %v: %s", a.Job.JobID, g, listed, g == kept, body)
			}
		}
		var back JobAnalyzed
		if err := DecodeJSON(body, &back); err != nil {
			t.Fatalf("%s: decode %s: %v", a.Job.JobID, body, err)
		}
		if !reflect.DeepEqual(a, back) {
			t.Fatalf("%s: round trip changed the job:\n%+v\n%+v", a.Job.JobID, a, back)
		}
		// The full form, as earlier versions wrote it, reads the same.
		type full JobAnalyzed
		old, _ := json.Marshal(full(a))
		var fromOld JobAnalyzed
		if err := DecodeJSON(old, &fromOld); err != nil || !reflect.DeepEqual(a, fromOld) {
			t.Fatalf("%s: the full form read back %+v (%v)", a.Job.JobID, fromOld, err)
		}
	}
}

// TestCompactSize: a 131,072-GPU job in five dimensions is a few hundred
// bytes on the wire, not the megabytes of its rank lists.
func TestCompactSize(t *testing.T) {
	t.Parallel()
	p := Parallelism{TP: 8, CP: 2, EP: 4, DP: 1024, PP: 8}
	a := JobAnalyzed{Job: JobSubmitted{JobID: "big", GPUs: MaxJobGPUs}, Parallelism: p, Order: Dimensions, Groups: LayoutGroups(p, Dimensions)}
	body, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) > 1024 {
		t.Fatalf("%d bytes: %s", len(body), body)
	}
	var back JobAnalyzed
	if err := DecodeJSON(body, &back); err != nil || !reflect.DeepEqual(a, back) {
		t.Fatalf("round trip: %v", err)
	}
}

// TestCompactRefused: a compact body whose groups cannot be rebuilt is
// refused naming the field, in words.
func TestCompactRefused(t *testing.T) {
	t.Parallel()
	const order = `["tp","cp","ep","dp","pp"]`
	for _, tc := range []struct {
		name, body, field string
	}{
		{"order short", `{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":["tp","dp"],"groups":[{"dimension":"tp","size":2}]}`, "order"},
		{"order repeated", `{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":["tp","tp","ep","dp","pp"],"groups":[{"dimension":"tp","size":2}]}`, "order"},
		{"degrees off", `{"job":{"job_id":"a","gpus":8},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":2}]}`, "parallelism"},
		{"unresolved", `{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2},"order":` + order + `,"groups":[{"dimension":"tp","size":2}]}`, "parallelism"},
		{"ep not dividing", `{"job":{"job_id":"a","gpus":6},"parallelism":{"tp":1,"dp":3,"pp":2,"cp":1,"ep":2},"order":` + order + `,"groups":[{"dimension":"pp","size":2}]}`, "parallelism"},
		{"too many gpus", `{"job":{"job_id":"a","gpus":262144},"parallelism":{"tp":2,"dp":131072,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":2}]}`, "job.gpus"},
		{"wrong size", `{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":4}]}`, "groups[0]"},
		{"no such dimension", `{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":4,"dp":1,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"dp","size":2}]}`, "groups[0]"},
		{"custom without groups", `{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":4,"dp":1,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"custom","name":"x","size":2}]}`, "groups[0].name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var a JobAnalyzed
			err := DecodeJSON([]byte(tc.body), &a)
			var de *DecodeError
			if !errors.As(err, &de) || len(de.Problems) != 1 || de.Problems[0].Field != tc.field || de.Problems[0].Code != DecodeInconsistent {
				t.Fatalf("error %#v, want one %s problem on %s", err, DecodeInconsistent, tc.field)
			}
			if msg := err.Error(); strings.Contains(msg, "events.") || strings.Contains(msg, "[]int") {
				t.Errorf("%q speaks Go", msg)
			}
		})
	}
	// Numbers as people write them still decode inside the compact form.
	var a JobAnalyzed
	body := []byte(`{"job":{"job_id":"a","gpus":4.0},"parallelism":{"tp":2,"dp":2e0,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":2}]}`)
	if err := DecodeJSON(body, &a); err != nil || !bytes.Contains(mustJSON(t, a.Groups), []byte("[[0,1],[2,3]]")) {
		t.Fatalf("decode %s: %v, groups %+v", body, err, a.Groups)
	}
	bad := []byte(`{"job":{"job_id":"a","gpus":4.5},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[]}`)
	if err := DecodeJSON(bad, &a); err == nil || !strings.Contains(err.Error(), "job.gpus must be a whole number, got 4.5") {
		t.Fatalf("decode %s: %v", bad, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzDecodeAnalyzed: whatever the body, reading a jobs.analyzed does not
// panic, fails only with a *DecodeError, and what it reads writes and
// reads back the same. (Run it with -fuzzminimizetime of a few seconds:
// minimising a 131,072-GPU input takes the default minute.)
func FuzzDecodeAnalyzed(f *testing.F) {
	const order = `["tp","cp","ep","dp","pp"]`
	for _, s := range []string{
		`{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":2},{"dimension":"dp","size":2}]}`,
		`{"job":{"job_id":"a","gpus":4,"groups":[{"name":"g","collective":"all_reduce","ranks":[0,3],"bytes":1}]},"parallelism":{"tp":4,"dp":1,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"custom","name":"g","size":2}]}`,
		`{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":2,"members":[[0,1],[2,3]]}]}`,
		`{"job":{"job_id":"a","gpus":8},"parallelism":{"tp":2,"dp":4,"pp":1,"cp":1,"ep":2},"order":["pp","dp","ep","cp","tp"],"groups":[{"dimension":"dp","size":4},{"dimension":"ep","size":2}]}`,
		`{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":2,"pp":1,"cp":1,"ep":1},"order":["tp"],"groups":[{"dimension":"tp","size":2}]}`,
		`{"job":{"job_id":"a","gpus":4},"parallelism":{"tp":2,"dp":0,"pp":1,"cp":1,"ep":0},"order":` + order + `,"groups":[{"dimension":"tp","size":2}]}`,
		`{"job":{"job_id":"a","gpus":1e9},"parallelism":{"tp":1e9,"dp":1,"pp":1,"cp":1,"ep":1},"order":` + order + `,"groups":[{"dimension":"tp","size":1e9}]}`,
		`{"groups":[{}]}`, `{}`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var a JobAnalyzed
		if err := DecodeJSON(body, &a); err != nil {
			var de *DecodeError
			if !errors.As(err, &de) || len(de.Problems) == 0 {
				t.Fatalf("DecodeJSON = %T %v, want a *DecodeError with problems", err, err)
			}
			return
		}
		out, err := json.Marshal(a)
		if err != nil {
			t.Fatalf("encode what was read: %v", err)
		}
		var back JobAnalyzed
		if err := DecodeJSON(out, &back); err != nil {
			t.Fatalf("read back %s: %v", out, err)
		}
		// Compared as written: null and [] read back alike.
		if again, err := json.Marshal(back); err != nil || !bytes.Equal(out, again) {
			t.Fatalf("round trip changed it:\n%s\n%s (%v)", out, again, err)
		}
		for i, g := range a.Groups {
			if g.Members == nil {
				t.Fatalf("groups[%d] read without members", i)
			}
		}
	})
}
