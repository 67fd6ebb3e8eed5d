package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/sim/replay"
)

func TestParseSeeds(t *testing.T) {
	tests := []struct {
		in      string
		want    []uint64
		wantErr string
	}{
		{in: "7", want: []uint64{7}},
		{in: "1-4", want: []uint64{1, 2, 3, 4}},
		{in: "1-3, 9,11-12", want: []uint64{1, 2, 3, 9, 11, 12}},
		{in: "0-0", want: []uint64{0}},
		{in: "", wantErr: "is not a seed"},
		{in: "a-3", wantErr: `"a-3" is not a seed`},
		{in: "5-2", wantErr: "A <= B"},
		{in: "1-3,2", wantErr: "seed 2 is listed twice"},
		{in: "1-5000", wantErr: "at most 1000 seeds"},
		{in: "0-18446744073709551615", wantErr: "at most 1000 seeds"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseSeeds(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseSeeds(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("parseSeeds(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestSeedTotals: the wins, and the geometric means of the ratios to
// blind (listed second here, so not the first strategy), by hand.
func TestSeedTotals(t *testing.T) {
	sum := func(strategy string, jct, multi float64) *replay.Summary {
		s := &replay.Summary{Strategy: strategy}
		s.Finished.JCTMeanSeconds, s.MultiGPU.JCTMeanSeconds = jct*3600, multi*3600
		return s
	}
	rows := []seedRow{
		{seed: 1, sums: []*replay.Summary{sum("topology-aware", 2, 4), sum("blind", 4, 8), sum("spread", 3, 9)}},
		{seed: 2, sums: []*replay.Summary{sum("topology-aware", 8, 2), sum("blind", 4, 2), sum("spread", 1, 1)}},
	}
	var buf bytes.Buffer
	w := textout.New(&buf)
	writeSeedTotals(w, []string{"topology-aware", "blind", "spread"}, rows)
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	// aware: ratios 0.5 and 2 (geometric mean 1), multi-GPU 0.5 and 1
	// (0.707); spread: 0.75 and 0.25 (0.433), multi 1.125 and 0.5 (0.75).
	got := strings.Join(strings.Fields(buf.String()), " ")
	for _, want := range []string{
		"ratio to blind's",
		"aware 1/2 1.000 (+0.0%) 0.707 (-29.3%)",
		"blind 0/2 1.000 (+0.0%) 1.000 (+0.0%)",
		"spread 1/2 0.433 (-56.7%) 0.750 (-25.0%)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("totals lack %q:\n%s", want, buf.String())
		}
	}
}

// TestReplaySeeds runs --seeds end to end: two small generated traces
// under two strategies, a row each, the totals, a report per seed; and
// refuses --seeds where there is no trace to generate.
func TestReplaySeeds(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	report := t.TempDir()
	root := newRoot()
	root.SetOut(&out)
	root.SetArgs([]string{"replay", "--trace", "synthetic", "--gpus", "256", "--count", "30", "--load", "1.2",
		"--seeds", "4-5", "--compare", "aware,blind", "--policies", "none", "--no-progress",
		"--data-dir", t.TempDir(), "--report", report})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"seed jobs aware blind lowest mean JCT", "4 30 ", "5 30 ", "over 2 seeds", "ratio to blind's"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if !regexp.MustCompile(`blind [0-2]/2 1\.000 \(\+0\.0%\) 1\.000 \(\+0\.0%\)`).MatchString(got) {
		t.Errorf("blind's totals are not its own ratio 1:\n%s", out.String())
	}
	for _, seed := range []string{"seed-4", "seed-5"} {
		if _, err := os.Stat(filepath.Join(report, seed, "summary.json")); err != nil {
			t.Errorf("report of %s: %v", seed, err)
		}
	}

	root = newRoot()
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	root.SetArgs([]string{"replay", "--trace", "itp", "--jobs", "x.csv", "--cluster", "c.yaml", "--seeds", "1-2"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--seeds: for --trace synthetic") {
		t.Fatalf("--seeds with an ITP log: %v", err)
	}
}
