package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toposched/toposched/events/eventstest"
	"github.com/toposched/toposched/internal/calibration"
	"github.com/toposched/toposched/internal/collective"
)

func TestModelCalibrate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	topo := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "a100-sxm-8gpu-nv12-17nic_xuesongtap-blog.txt")
	pcie := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt")
	meas := filepath.Join("..", "..", "internal", "formats", "nccltests", "testdata", "aws-p4de-a100_2node-16gpu-efa_all_reduce_awsome-distributed-training.txt")
	data, err := os.ReadFile(meas)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	cut := filepath.Join(dir, "cut_all_reduce.txt")
	last := lines[len(lines)/2]
	if err := os.WriteFile(cut, []byte(strings.Join(lines[:len(lines)/2], "\n")+"\n"+last[:len(last)/2]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A time edited (halved) on one row: its algbw is no longer its size
	// over its time.
	edited := filepath.Join(dir, "edited_all_reduce.txt")
	if err := os.WriteFile(edited, []byte(strings.Replace(string(data), "    13552   39.62", "     6776   39.62", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "set.json")

	got, err := runModel(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", meas, "--out", out)
	if err != nil || !strings.Contains(got, "net     efficiency") || !strings.Contains(got, "wrote "+out) {
		t.Fatalf("calibrate: %v\n%s", err, got)
	}
	if got, err := runModel(t, "predict", "--topology", topo, "--bytes", "1G", "--calibration", out); err != nil || !strings.Contains(got, "busbw") {
		t.Fatalf("predict --calibration: %v\n%s", err, got)
	}
	// Per node model: two fits, one set.
	models := filepath.Join(dir, "models.json")
	if got, err := runModel(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", meas, "--model", "A100-SXM4-80GB", "--out", models); err != nil ||
		!strings.Contains(got, "A100-SXM4-80GB net efficiency") {
		t.Fatalf("calibrate --model: %v\n%s", err, got)
	}
	if got, err := runModel(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", meas, "--model", "A100-SXM4-40GB", "--into", models, "--out", models); err != nil {
		t.Fatalf("calibrate --into: %v\n%s", err, got)
	}
	set, err := loadCalibration(models)
	if err != nil || len(set.Models) != 2 || set.Models["A100-SXM4-80GB"].Net == 0 || set.Models["A100-SXM4-40GB"].Net == 0 || set.Efficiency.Net != 0 {
		t.Fatalf("set %+v %v", set, err)
	}
	unnamed := filepath.Join(dir, "meas.txt")
	if err := os.WriteFile(unnamed, data, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"version": 1, "efficiency": {"net": 7}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"cut off", []string{"calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", cut, "--out", filepath.Join(dir, "x.json")},
			[]string{"cut_all_reduce.txt:", "cut off"}},
		{"time edited", []string{"calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", edited, "--out", filepath.Join(dir, "e.json")},
			[]string{"edited_all_reduce.txt:", "algbw", "is not size", "size 536870912 / time 6776 µs"}},
		{"another topology", []string{"calibrate", "--topology", pcie, "--nccl-tests", meas, "--out", filepath.Join(dir, "y.json")},
			[]string{"aws-p4de", "above", "line rate"}},
		{"no collective in the log nor the name", []string{"calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", unnamed, "--out", filepath.Join(dir, "z.json")},
			[]string{"meas.txt:3:", "--collective"}},
		{"bad calibration", []string{"predict", "--topology", topo, "--bytes", "1G", "--calibration", bad},
			[]string{"bad.json", "bad.json:1: efficiency.net: 7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runModel(t, tc.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	for _, f := range []string{"x.json", "y.json", "z.json", "e.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s written after a refusal", f)
		}
	}
}

// predict --calibration-from reads the set in force in a running
// operator's bucket, and predicts as --calibration with the same file does.
func TestModelPredictCalibrationFrom(t *testing.T) {
	t.Parallel()
	srv := eventstest.Server(t)
	b := eventstest.Bus(t, srv.ClientURL(), "test")
	ctx := eventstest.Context(t, 30*time.Second)
	pcie := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt")
	file := filepath.Join(t.TempDir(), "lab.json")
	set := []byte(`{"version": 1, "name": "lab", "efficiency": {"pcie": 0.5}}`)
	if err := os.WriteFile(file, set, 0o600); err != nil {
		t.Fatal(err)
	}
	url := srv.ClientURL()
	empty, err := runModel(t, "predict", "--topology", pcie, "--bytes", "1G", "--calibration-from", url, "--prefix", b.Subjects.Prefix)
	if err != nil || !strings.Contains(empty, "calibrated: no calibration bucket") {
		t.Fatalf("before any push: %v\n%s", err, empty)
	}
	kv, err := calibration.OpenKV(ctx, b.JetStream(), b.Subjects.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := calibration.Push(ctx, kv, file, set); err != nil {
		t.Fatal(err)
	}
	fromKV, err := runModel(t, "predict", "--topology", pcie, "--bytes", "1G", "--calibration-from", url, "--prefix", b.Subjects.Prefix)
	if err != nil || !strings.Contains(fromKV, "calibrated: lab@"+calibration.Revision(set)[:12]) {
		t.Fatalf("from the bucket: %v\n%s", err, fromKV)
	}
	fromFile, err := runModel(t, "predict", "--topology", pcie, "--bytes", "1G", "--calibration", file)
	if err != nil {
		t.Fatal(err)
	}
	busbw := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "busbw:") {
				return l
			}
		}
		return ""
	}
	if busbw(fromKV) == "" || busbw(fromKV) != busbw(fromFile) || busbw(fromKV) == busbw(empty) {
		t.Errorf("bucket %q, file %q, defaults %q", busbw(fromKV), busbw(fromFile), busbw(empty))
	}
}

// runModelSplit runs toposched model with stdout and stderr apart.
func runModelSplit(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"model"}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

// slowed writes a copy of an nccl-tests output whose rows of
// collective.FitMinBytes and more took factor times as long (lines kept).
func slowed(t *testing.T, src, dst string, factor float64) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	n := 0
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) != 14 || f[0] != "0:" {
			continue
		}
		if size, err := strconv.ParseFloat(f[1], 64); err != nil || size < collective.FitMinBytes {
			continue
		}
		for j, scale := range map[int]float64{6: factor, 7: 1 / factor, 8: 1 / factor, 10: factor, 11: 1 / factor, 12: 1 / factor} {
			v, err := strconv.ParseFloat(f[j], 64)
			if err != nil {
				t.Fatal(err)
			}
			f[j] = strconv.FormatFloat(v*scale, 'g', 6, 64)
		}
		lines[i] = strings.Join(f, " ")
		n++
	}
	if n == 0 {
		t.Fatalf("%s: no row to slow", src)
	}
	if err := os.WriteFile(dst, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Issue 46: a file whose large rows were 1,000 times slower was fitted to a
// network efficiency of 0.0004 and written without a word, its sources
// named by absolute paths. A fit below its link's floor is refused, naming
// the link, the value, the floor and the measurements, and nothing is
// written; one 20 times slower (47 times under the default here: a 2-node
// tree on this topology is predicted above the file's rows) is written
// with a warning on stderr naming the link and the factor; no source is
// an absolute path.
func TestModelCalibrateImplausible(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	topo := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "a100-sxm-8gpu-nv12-17nic_xuesongtap-blog.txt")
	meas := filepath.Join("..", "..", "internal", "formats", "nccltests", "testdata", "aws-p4de-a100_2node-16gpu-efa_all_reduce_awsome-distributed-training.txt")

	slow1000 := filepath.Join(dir, "slow1000_all_reduce.txt")
	slowed(t, meas, slow1000, 1000)
	out := filepath.Join(dir, "slow1000.json")
	stdout, stderr, err := runModelSplit(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", slow1000, "--out", out)
	if err == nil {
		t.Fatalf("a fit 1,000 times slower was written\n%s%s", stdout, stderr)
	}
	for _, w := range []string{"efficiency.net = 0.0004", "below the floor 0.001 of line rate for net links", "nothing written",
		"net fitted to 0.000402 from 5 measurements", "slow1000_all_reduce.txt:27"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("refusal %q lacks %q", err, w)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%s written after the refusal", out)
	}

	slow20 := filepath.Join(dir, "slow20_all_reduce.txt")
	slowed(t, meas, slow20, 20)
	out = filepath.Join(dir, "slow20.json")
	stdout, stderr, err = runModelSplit(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", slow20, "--out", out)
	if err != nil {
		t.Fatalf("a fit 20 times slower refused: %v\n%s%s", err, stdout, stderr)
	}
	for _, w := range []string{"model calibrate: warning: efficiency.net = 0.0202: 47.5× below the documented 0.96", "slow20_all_reduce.txt:27"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr lacks %q:\n%s", w, stderr)
		}
	}
	if !strings.Contains(stdout, "wrote "+out) {
		t.Errorf("stdout:\n%s", stdout)
	}
	set, err := loadCalibration(out)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(set.Warnings(), "\n"); !strings.Contains(got, "efficiency.net") {
		t.Errorf("the written set's warnings %q", got)
	}

	// The measurements named by an absolute path, and by one outside the
	// working directory: stored as base names, so neither the temporary
	// directory nor ../.. reaches the set.
	abs, err := filepath.Abs(meas)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{abs, meas, slow20} {
		out := filepath.Join(dir, "paths.json")
		if _, _, err := runModelSplit(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", m, "--out", out); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), dir) || strings.Contains(string(data), abs) || strings.Contains(string(data), "../") {
			t.Errorf("%s: the set names a path of this machine:\n%s", m, data)
		}
		if !strings.Contains(string(data), `"`+filepath.Base(m)+`:30"`) {
			t.Errorf("%s: the set does not name %s:30:\n%s", m, filepath.Base(m), data)
		}
	}
}

func TestSourceName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ file, wd, want string }{
		{"runs/ar.txt", "/home/alice/lab", "runs/ar.txt"},
		{"./ar.txt", "/home/alice/lab", "ar.txt"},
		{"/home/alice/lab/runs/node3/ar.txt", "/home/alice/lab", "runs/node3/ar.txt"},
		{"/data/runs/ar.txt", "/home/alice/lab", "ar.txt"},
		{"../ar.txt", "/home/alice/lab", "ar.txt"},
		{"runs/../../x/ar.txt", "/home/alice/lab", "ar.txt"},
		{"/home/alice/lab/runs/ar.txt", "", "ar.txt"},
	} {
		if got := sourceName(tc.file, tc.wd); got != tc.want {
			t.Errorf("sourceName(%q, %q) = %q, want %q", tc.file, tc.wd, got, tc.want)
		}
	}
	c := &collective.Calibration{Fits: []collective.Fit{{Sources: []string{"/home/alice/lab/runs/ar.txt:30", "runs/ar.txt:31"}}},
		Latency: &collective.LatencyFit{Sources: []string{"/tmp/x/ar.txt:12"}}}
	relativeSources(c, "/home/alice/lab")
	if got := strings.Join(append(c.Fits[0].Sources, c.Latency.Sources...), " "); got != "runs/ar.txt:30 runs/ar.txt:31 ar.txt:12" {
		t.Errorf("sources %s", got)
	}
}

// Real logs: an all_gather with rows of size 0 (refused before: "size 0:
// expected a positive byte count"), six runs in one log, and a machine
// whose fit is far from the defaults (PCIe with peer-to-peer off: NCCL
// goes through host memory), written with a warning that names the link
// and the factor; a log of another rank count is refused.
func TestModelCalibrateRealLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	td := filepath.Join("..", "..", "internal", "formats", "nccltests", "testdata")
	topo := filepath.Join(td, "machines", "rtx2080ti-2gpu-pix-no-p2p_autodl-blog.topo.txt")
	gather := filepath.Join(td, "rtx2080ti-2gpu-pcie-no-p2p_all_gather_autodl-blog.txt")
	six := filepath.Join(td, "rtx2080ti-2gpu-pcie-no-p2p_six-collectives_autodl-blog.txt")
	for _, tc := range []struct {
		name, file string
		stderr     []string
	}{
		{"all_gather with size-0 rows", gather, []string{"warning: efficiency.pcie = 0.12", "× below the documented 0.8", "all_gather_autodl-blog.txt:35"}},
		{"six runs", six, []string{"six-collectives_autodl-blog.txt:85: broadcast: not a collective the model predicts, skipped", "warning: efficiency.pcie"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, tc.name+".json")
			var stdout, stderr bytes.Buffer
			if err := runCalibrate(&stdout, &stderr, calibrateFlags{topology: topo, nodes: 1, ncclTests: []string{tc.file}, algo: "auto", out: out}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(stdout.String(), "pcie    efficiency") {
				t.Errorf("stdout %s", stdout.String())
			}
			for _, w := range tc.stderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if _, err := loadCalibration(out); err != nil {
				t.Errorf("written: %v", err)
			}
		})
	}
	pcie8 := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "rtx4090-8gpu-pcie-switch_nccl-tests-issue-307.txt")
	err := runCalibrate(io.Discard, io.Discard, calibrateFlags{topology: pcie8, nodes: 1, ncclTests: []string{six}, algo: "auto", out: filepath.Join(dir, "x.json")})
	if err == nil || !strings.Contains(err.Error(), "six-collectives_autodl-blog.txt:1: all_reduce ran on 2 ranks") || !strings.Contains(err.Error(), "the topology gives 8") {
		t.Fatalf("another rank count: %v", err)
	}
}

// A sweep faster than its links at line rate, as the model prices them,
// (here the 2-node tree's rows of 128 MiB and more, made 2.35 times as fast) is
// written with its fit at line rate, and stderr says that the fit stopped
// there and what it asked for.
func TestModelCalibrateAtLineRate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	topo := filepath.Join("..", "..", "internal", "formats", "nvsmi", "testdata", "a100-sxm-8gpu-nv12-17nic_xuesongtap-blog.txt")
	meas := filepath.Join("..", "..", "internal", "formats", "nccltests", "testdata", "aws-p4de-a100_2node-16gpu-efa_all_reduce_awsome-distributed-training.txt")
	fast := filepath.Join(dir, "fast_all_reduce.txt")
	slowed(t, meas, fast, 1/2.35)
	out := filepath.Join(dir, "fast.json")
	stdout, stderr, err := runModelSplit(t, "calibrate", "--topology", topo, "--nodes", "2", "--nccl-tests", fast, "--out", out)
	if err != nil {
		t.Fatalf("calibrate: %v\n%s%s", err, stdout, stderr)
	}
	if !strings.Contains(stderr, "model calibrate: fits[0] (net) stopped at line rate, where its 5 measurements asked for 1.0") {
		t.Errorf("stderr does not say the fit stopped at line rate:\n%s", stderr)
	}
	set, err := loadCalibration(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Fits) != 1 || set.Fits[0].Efficiency != 1 || !(set.Fits[0].AboveLineRate > 1) {
		t.Errorf("fits %+v", set.Fits)
	}
}
