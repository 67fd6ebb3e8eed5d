package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/placer"
	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/sim/replay"
)

// parseSeeds reads --seeds: "1-10", "3,7,9", or both ("1-4,9").
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	seen := map[uint64]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--seeds %q: %q is not a seed or a range A-B", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 64); err != nil || b < a {
				return nil, fmt.Errorf("--seeds %q: %q is not a range A-B with A <= B", s, part)
			}
		}
		if b-a >= maxSeeds {
			return nil, fmt.Errorf("--seeds %q: at most %d seeds", s, maxSeeds)
		}
		for v := a; ; v++ {
			if seen[v] {
				return nil, fmt.Errorf("--seeds %q: seed %d is listed twice", s, v)
			}
			seen[v] = true
			out = append(out, v)
			if v == b {
				break
			}
		}
	}
	if len(out) > maxSeeds {
		return nil, fmt.Errorf("--seeds %q: at most %d seeds", s, maxSeeds)
	}
	return out, nil
}

// maxSeeds bounds --seeds: each seed is one replay per strategy.
const maxSeeds = 1000

// seedRow is one generated trace's replay under every strategy.
type seedRow struct {
	seed uint64
	jobs int
	sums []*replay.Summary
}

// runSeeds replays one generated trace per seed under every strategy
// and reports, per seed and over all of them, which strategy's mean
// completion time is lowest: a figure that one trace, whose saturated
// queue turns any change of placement into another history, cannot give.
func runSeeds(ctx context.Context, g *globals, f replayFlags, seeds []uint64, out io.Writer) error {
	rs, err := newReplaySettings(g, f)
	if err != nil {
		return err
	}
	strategies := rs.strategies
	w := textout.New(out)
	var rows []seedRow
	for _, seed := range seeds {
		f.seed = seed
		p, err := prepareReplay(f)
		if err != nil {
			return err
		}
		row := seedRow{seed: seed, jobs: len(p.trace.Jobs)}
		var results []*replay.Result
		dataDir := f.dataDir
		if dataDir != "" {
			dataDir = filepath.Join(dataDir, fmt.Sprintf("seed-%d", seed))
		}
		for _, s := range strategies {
			r, err := replay.Run(ctx, rs.config(f, p, s, dataDir))
			if err != nil {
				p.cleanup()
				return fmt.Errorf("seed %d, %s: %w", seed, s, err)
			}
			results = append(results, r)
			row.sums = append(row.sums, &r.Summary)
		}
		p.cleanup()
		replay.CompareWithBlind(row.sums...)
		if f.report != "" {
			if err := replay.WriteReport(filepath.Join(f.report, fmt.Sprintf("seed-%d", seed)), results...); err != nil {
				return err
			}
		}
		if len(rows) == 0 {
			w.Printf("%-6s %6s", "seed", "jobs")
			for _, s := range strategies {
				w.Printf(" %14s", shortStrategy(s))
			}
			w.Printf("  %s\n", "lowest mean JCT")
		}
		rows = append(rows, row)
		w.Printf("%-6d %6d", seed, row.jobs)
		for _, s := range row.sums {
			w.Printf(" %13.2fh", s.Finished.JCTMeanSeconds/3600)
		}
		w.Printf("  %s\n", shortStrategy(row.sums[lowest(row.sums, meanJCT)].Strategy))
		if err := w.Err(); err != nil {
			return err
		}
	}
	writeSeedTotals(w, strategies, rows)
	return w.Err()
}

func meanJCT(s *replay.Summary) float64     { return s.Finished.JCTMeanSeconds }
func multiGPUJCT(s *replay.Summary) float64 { return s.MultiGPU.JCTMeanSeconds }

// shortStrategy is the name --compare takes for a strategy.
func shortStrategy(name string) string {
	if name == placer.StrategyTopologyAware {
		return "aware"
	}
	return name
}

// lowest is the index of the summary with the lowest figure; ties go to
// the first listed.
func lowest(sums []*replay.Summary, fig func(*replay.Summary) float64) int {
	best := 0
	for i, s := range sums {
		if fig(s) < fig(sums[best]) {
			best = i
		}
	}
	return best
}

// writeSeedTotals prints, per strategy, how many seeds it had the lowest
// mean JCT on, and the geometric mean over the seeds of its mean JCT and
// of its multi-GPU jobs' mean JCT, each over blind first fit's when it
// was replayed, else the first strategy's (ratios of traces of different
// lengths average fairly only geometrically).
func writeSeedTotals(w *textout.Writer, strategies []string, rows []seedRow) {
	base := max(slices.Index(strategies, placer.StrategyBlind), 0)
	w.Printf("\nover %d seeds (geometric mean over the seeds of each figure's ratio to %s's)\n", len(rows), shortStrategy(strategies[base]))
	w.Printf("%-14s %8s %14s %22s\n", "strategy", "lowest", "mean JCT", "multi-GPU mean JCT")
	for i, s := range strategies {
		wins := 0
		for _, r := range rows {
			if lowest(r.sums, meanJCT) == i {
				wins++
			}
		}
		w.Printf("%-14s %8s %14s %22s\n", shortStrategy(s), fmt.Sprintf("%d/%d", wins, len(rows)),
			ratioText(geoRatio(rows, i, base, meanJCT)), ratioText(geoRatio(rows, i, base, multiGPUJCT)))
	}
}

// geoRatio is the geometric mean over rows of strategy i's figure over
// strategy base's; NaN when a seed has no figure for either.
func geoRatio(rows []seedRow, i, base int, fig func(*replay.Summary) float64) float64 {
	sum := 0.0
	for _, r := range rows {
		a, b := fig(r.sums[i]), fig(r.sums[base])
		if !(a > 0) || !(b > 0) {
			return math.NaN()
		}
		sum += math.Log(a / b)
	}
	return math.Exp(sum / float64(len(rows)))
}

func ratioText(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.3f (%+.1f%%)", x, 100*(x-1))
}
