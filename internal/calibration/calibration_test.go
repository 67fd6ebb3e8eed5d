package calibration

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/topology"
)

// Issue 46: a set with net 1e-300 was put in the bucket and applied. Push
// refuses it and a set whose fit disagrees with its efficiency, naming the
// file, line and field, and leaves the bucket as it was; a value put past
// Push is read back refused, naming the entry; Update (the online moves)
// refuses a set below a floor too.
func TestImplausibleSetsRefused(t *testing.T) {
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	kv, err := OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	good := []byte(`{"version": 1, "name": "lab", "efficiency": {"net": 0.9}}`)
	_, kvRev, err := Push(ctx, kv, "lab.json", good)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, value, want string }{
		{"tiny", "{\"version\": 1,\n \"efficiency\": {\"net\": 1e-300}}", "tiny.json:2: efficiency.net: 1e-300: below the floor 0.001"},
		{"disagreeing", "{\"version\": 1, \"efficiency\": {\"net\": 0.9},\n \"fits\": [{\"kind\": \"net\", \"efficiency\": 0.45, \"samples\": 3, \"ratio\": 0.47, \"sources\": []}]}",
			"disagreeing.json:2: fits[0].efficiency: 0.45: disagrees with efficiency.net = 0.9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Push(ctx, kv, tc.name+".json", []byte(tc.value))
			var errs collective.CalibrationErrors
			if !errors.As(err, &errs) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("push: %v, want %q", err, tc.want)
			}
			if e, err := InForce(ctx, kv); err != nil || e.KVRevision != kvRev || e.Set == nil || e.Set.Name != "lab" {
				t.Fatalf("after the refusal the bucket holds %+v (%v)", e, err)
			}
		})
	}
	// Past Push, as a replica reads it.
	rev, err := kv.Put(ctx, KVKey, []byte("{\"version\": 1,\n \"efficiency\": {\"net\": 1e-300}}"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := InForce(ctx, kv)
	if err != nil || e.Set != nil || e.Err == nil || !strings.Contains(e.Err.Error(), EntryName(kv.Bucket(), rev)+":2: efficiency.net: 1e-300: below the floor") {
		t.Fatalf("entry %+v (%v)", e, err)
	}
	tiny := &collective.Calibration{Version: collective.CalibrationVersion, Name: "online", Efficiency: topology.Efficiency{Net: 1e-300}}
	if _, err := Update(ctx, kv, tiny, rev); err == nil || !strings.Contains(err.Error(), "efficiency.net = 1e-300: below the floor") {
		t.Fatalf("update with net 1e-300: %v", err)
	}
}
