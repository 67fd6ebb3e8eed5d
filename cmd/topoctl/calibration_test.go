package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/services/operator"
)

func TestCalibrationPushRefusesBadFileBeforeNATS(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, body, want string }{
		{"cut", "{\n  \"version\": 1,\n  \"efficiency\": {\"pcie\": 0.7", "cut.json:3: cut off"},
		{"impossible", "{\n  \"version\": 1,\n  \"efficiency\": {\n    \"nvlink\": 1.3,\n    \"net\": -0.1}}",
			"impossible.json:4: efficiency.nvlink: 1.3: expected a share of line rate"},
		{"negative overhead", "{\"version\": 1,\n \"efficiency\": {\"step_overhead_us\": -4}}", "negative overhead.json:2: efficiency.step_overhead_us: -4"},
		// Issue 46: pushed, and applied by every replica.
		{"tiny", "{\"version\": 1,\n \"name\": \"tiny\",\n \"efficiency\": {\"net\": 1e-300}}",
			"tiny.json:3: efficiency.net: 1e-300: below the floor 0.001 of line rate for net links"},
		{"disagreeing fit", "{\"version\": 1,\n \"efficiency\": {\"pcie\": 0.6},\n \"fits\": [\n  {\"kind\": \"pcie\", \"efficiency\": 0.06, \"samples\": 3, \"ratio\": 0.08, \"sources\": [\"ar.txt:30\"]}]}",
			"disagreeing fit.json:4: fits[0].efficiency: 0.06: disagrees with efficiency.pcie = 0.6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, tc.name+".json")
			if err := os.WriteFile(file, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := runPolicy("--nats-url", "nats://127.0.0.1:1", "calibration", "push", file)
			if err == nil || !strings.Contains(err.Error(), "nothing pushed") {
				t.Fatalf("err %v, want a local refusal\n%s", err, out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out)
			}
		})
	}
}

// A pushed set reaches placement and the optimizer; a bad value put past
// topoctl is refused by the replica with its line and the set in force
// stays; withdrawing falls back to the documented efficiencies.
func TestCalibrationPushShowWithdraw(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, b, op := startReplicas(t, ctx)

	file := filepath.Join(t.TempDir(), "lab.json")
	good := `{"version": 1, "name": "lab", "efficiency": {"nvlink": 0.7, "pcie": 0.55, "op_overhead_us": 19.5},
 "compute": [{"model": "T4", "factor": 1.18, "samples": 12, "ratio": 1.05, "sources": ["telemetry:j1@40"]}]}` + "\n"
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	rev := calibration.Revision([]byte(good))
	out, err := runPolicy("--nats-url", url, "calibration", "push", file)
	if err != nil {
		t.Fatalf("push: %v\n%s", err, out)
	}
	for _, w := range []string{"pushed lab@" + rev[:12], "applied by r1 (optimizer, placement): lab@" + rev[:12] + " from kv (replaced default)",
		"efficiency: nvlink 0.700, nvls 0.611, pcie 0.550, net 0.960", "step overhead 2.80 us, call overhead 19.50 us"} {
		if !strings.Contains(out, w) {
			t.Errorf("push output lacks %q:\n%s", w, out)
		}
	}
	if bw := op.PlacementService().Bandwidths(); bw == nil || bw.Efficiency.PCIe != 0.55 || bw.Efficiency.OpOverheadUS != 19.5 {
		t.Errorf("placement predicts with %+v", bw)
	}
	if bw := op.OptimizerService().Bandwidths(); bw == nil || bw.Efficiency.NVLink != 0.7 {
		t.Errorf("optimizer predicts with %+v", bw)
	}
	if c, ok := op.PlacementService().Bandwidths().ComputeOf("T4"); !ok || c.Factor != 1.18 {
		t.Errorf("placement's T4 compute correction %+v, %v", c, ok)
	}

	// A value topoctl would refuse, put straight into the bucket.
	kv, err := calibration.OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	answers, errc, err := followPolicyDomain(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	bad := "{\"version\": 1,\n \"name\": \"typo\",\n \"efficiency\": {\"nvlink\": 7.0}}"
	badRev, err := kv.Put(ctx, calibration.KVKey, []byte(bad))
	if err != nil {
		t.Fatal(err)
	}
	for got := false; !got; {
		select {
		case v := <-answers:
			out, _ := json.Marshal(v)
			if !strings.Contains(string(out), `"kv_revision":`+itoa(badRev)) {
				continue
			}
			for _, w := range []string{`"name":"typo"`, `"line":3`, `"field":"efficiency.nvlink"`, `"in_force":"` + rev + `"`} {
				if !strings.Contains(string(out), w) {
					t.Errorf("answer lacks %s: %s", w, out)
				}
			}
			got = true
		case err := <-errc:
			t.Fatalf("follow: %v", err)
		}
	}
	if bw := op.PlacementService().Bandwidths(); bw == nil || bw.Efficiency.PCIe != 0.55 || bw.Efficiency.OpOverheadUS != 19.5 {
		t.Errorf("after the refusal placement predicts with %+v", bw)
	}

	out, err = runPolicy("--nats-url", url, "calibration", "show", "--history")
	if err != nil {
		t.Fatalf("show: %v\n%s", err, out)
	}
	for _, w := range []string{"kv revision 1 at ", "lab@" + rev[:12], "refused value", "efficiency.nvlink: 7", "r1 (optimizer, placement): lab@" + rev[:12] + " from kv",
		"  compute T4: x1.180 the speed table's time, from 12 jobs (measured/predicted 1.050 before its last move): telemetry:j1@40"} {
		if !strings.Contains(out, w) {
			t.Errorf("show output lacks %q:\n%s", w, out)
		}
	}

	out, err = runPolicy("--nats-url", url, "calibration", "withdraw")
	if err != nil {
		t.Fatalf("withdraw: %v\n%s", err, out)
	}
	for got := false; !got; {
		select {
		case v := <-answers:
			out, _ := json.Marshal(v)
			got = strings.Contains(string(out), `"revision":"default"`) && strings.Contains(string(out), `"previous":"`+rev+`"`)
		case err := <-errc:
			t.Fatalf("follow: %v", err)
		}
	}
	if bw := op.PlacementService().Bandwidths(); bw != nil {
		t.Errorf("after the withdrawal placement predicts with %+v, want the defaults", bw)
	}
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// Issue 46: a set with net 1e-300 was pushed and applied by every replica.
// topoctl refuses it before NATS is touched; put into the bucket past
// topoctl, every replica answers policy.calibration_rejected naming the
// link and the value, and the set in force stays; a set whose fit
// disagrees with its efficiency likewise. A set far from the defaults is
// pushed and applied, with a warning from push and from show.
func TestCalibrationImplausibleRefusedByReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url, b, op := startReplicas(t, ctx)
	dir := t.TempDir()
	write := func(name, body string) string {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	good := `{"version": 1, "name": "lab", "efficiency": {"net": 0.9}}` + "\n"
	rev := calibration.Revision([]byte(good))
	if out, err := runPolicy("--nats-url", url, "calibration", "push", write("lab.json", good)); err != nil || strings.Contains(out, "warning") {
		t.Fatalf("push: %v\n%s", err, out)
	}
	kv, err := calibration.OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	before, err := calibration.InForce(ctx, kv)
	if err != nil || before == nil {
		t.Fatalf("in the bucket: %+v %v", before, err)
	}

	tiny := "{\"version\": 1,\n \"name\": \"tiny\",\n \"efficiency\": {\"net\": 1e-300}}"
	out, err := runPolicy("--nats-url", url, "calibration", "push", write("tiny.json", tiny))
	if err == nil || !strings.Contains(out, "tiny.json:3: efficiency.net: 1e-300: below the floor") {
		t.Fatalf("push of net 1e-300: %v\n%s", err, out)
	}
	if e, err := calibration.InForce(ctx, kv); err != nil || e.KVRevision != before.KVRevision {
		t.Fatalf("after the refused push the bucket holds %+v (%v), want kv revision %d", e, err, before.KVRevision)
	}

	answers, errc, err := followPolicyDomain(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	rejected := func(value string, want ...string) {
		t.Helper()
		kvRev, err := kv.Put(ctx, calibration.KVKey, []byte(value))
		if err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case v := <-answers:
				out, _ := json.Marshal(v)
				if !strings.Contains(string(out), `"kv_revision":`+itoa(kvRev)) {
					continue
				}
				if _, ok := v.(*events.CalibrationRejected); !ok {
					t.Errorf("answer %T, want policy.calibration_rejected: %s", v, out)
				}
				for _, w := range append(want, `"in_force":"`+rev+`"`) {
					if !strings.Contains(string(out), w) {
						t.Errorf("answer lacks %s: %s", w, out)
					}
				}
				if bw := op.PlacementService().Bandwidths(); bw == nil || bw.Efficiency.Net != 0.9 {
					t.Errorf("after the refusal placement predicts with %+v", bw)
				}
				if bw := op.OptimizerService().Bandwidths(); bw == nil || bw.Efficiency.Net != 0.9 {
					t.Errorf("after the refusal the optimizer predicts with %+v", bw)
				}
				return
			case err := <-errc:
				t.Fatalf("follow: %v", err)
			}
		}
	}
	rejected(tiny, `"name":"tiny"`, `"line":3`, `"field":"efficiency.net"`, `1e-300: below the floor 0.001 of line rate for net links`)
	rejected("{\"version\": 1,\n \"efficiency\": {\"net\": 0.9},\n \"fits\": [\n  {\"kind\": \"net\", \"efficiency\": 0.09, \"samples\": 3, \"ratio\": 0.1, \"sources\": [\"ar.txt:30\"]}]}",
		`"line":4`, `"field":"fits[0].efficiency"`, `0.09: disagrees with efficiency.net = 0.9`)

	far := `{"version": 1, "name": "far", "efficiency": {"net": 0.2}, "fits": [{"kind": "net", "efficiency": 0.2, "samples": 3, "ratio": 0.21, "sources": ["ar.txt:30"]}]}`
	out, err = runPolicy("--nats-url", url, "calibration", "push", write("far.json", far))
	if err != nil {
		t.Fatalf("push of a set far from the defaults: %v\n%s", err, out)
	}
	for _, w := range []string{"warning: " + filepath.Join(dir, "far.json") + ": efficiency.net = 0.2: 4.8× below the documented 0.96", "fitted from 3 measurements: ar.txt:30",
		"applied by r1"} {
		if !strings.Contains(out, w) {
			t.Errorf("push output lacks %q:\n%s", w, out)
		}
	}
	out, err = runPolicy("--nats-url", url, "calibration", "show")
	if err != nil || !strings.Contains(out, "  warning: efficiency.net = 0.2: 4.8× below") || !strings.Contains(out, "fit net: 0.200 from 3 samples (measured/predicted 0.210 before): ar.txt:30") {
		t.Errorf("show: %v\n%s", err, out)
	}
}

// startReplicas runs placement and the optimizer, the replicas that apply
// calibration sets, on a test server until the test ends, and returns the
// server's URL, their bus and the operator.
func startReplicas(t *testing.T, ctx context.Context) (string, *bus.Bus, *operator.Operator) {
	t.Helper()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "operator")
	op, err := operator.New(operator.Config{Services: []string{operator.Placement, operator.Optimizer}, Replica: "r1"},
		operator.Deps{Bus: b, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stop, err := operator.Background(ctx, op)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return srv.ClientURL(), b, op
}
