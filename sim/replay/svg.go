package replay

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Series is one strategy's timeline in a plot.
type Series struct {
	Name   string
	Points []Point
}

// Plot geometry and colours (colour-blind safe: blue and orange).
const (
	plotW, plotH     = 900, 600
	marginL, marginR = 70, 30
	panelH           = 210
	panel1Y, panel2Y = 70, 350
	maxPlotPoints    = 800
)

// seriesColours are Okabe and Ito's colour-blind safe palette.
var seriesColours = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000", "#F0E442"}

// Plot writes an SVG of two panels over trace time: the share of GPUs
// allocated, and the fragmentation (expected share of free GPUs the
// trace's job mix cannot use), one line per series. It is written by hand:
// two panels of polylines need no plotting library, and the output is
// byte-for-byte stable for golden tests.
func Plot(w io.Writer, title string, series []Series) error {
	var sb strings.Builder
	span := 0.0
	for _, s := range series {
		for _, p := range s.Points {
			span = max(span, p.T)
		}
	}
	unit, per := "hours", 3600.0
	switch {
	case span > 4*86400:
		unit, per = "days", 86400
	case span < 2*3600:
		unit, per = "minutes", 60
	}
	if span <= 0 {
		span = 1
	}
	innerW := float64(plotW - marginL - marginR)
	x := func(t float64) float64 { return float64(marginL) + t/span*innerW }
	var names []string
	for _, s := range series {
		names = append(names, s.Name)
	}
	svgHead(&sb, title, names)
	panels := []struct {
		y     int
		label string
		value func(Point) float64
	}{
		{panel1Y, "GPUs allocated (%)", func(p Point) float64 { return p.Allocated }},
		{panel2Y, "fragmentation: free GPUs the job mix cannot use (%)", func(p Point) float64 { return p.Fragmentation }},
	}
	for _, pn := range panels {
		y := func(v float64) float64 { return float64(pn.y+panelH) - min(max(v, 0), 1)*panelH }
		fmt.Fprintf(&sb, `<text x="%d" y="%d">%s</text>`+"\n", marginL, pn.y-8, esc(pn.label))
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.0f" height="%d" fill="none" stroke="#888"/>`+"\n", marginL, pn.y, innerW, panelH)
		for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
			fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n",
				marginL, y(v), float64(marginL)+innerW, y(v), marginL-6, y(v)+4, v*100)
		}
		for _, t := range roundTicks(span/per, 6) {
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(t*per), pn.y+panelH+16, tickLabel(t))
		}
		for i, s := range series {
			var pts strings.Builder
			for _, p := range thin(s.Points) {
				fmt.Fprintf(&pts, "%.1f,%.1f ", x(p.T), y(pn.value(p)))
			}
			fmt.Fprintf(&sb, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n",
				seriesColours[i%len(seriesColours)], strings.TrimSpace(pts.String()))
		}
	}
	fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle">trace time (%s)</text>`+"\n", float64(marginL)+innerW/2, panel2Y+panelH+36, unit)
	fmt.Fprintln(&sb, `</svg>`)
	_, err := io.WriteString(w, sb.String())
	return err
}

// thin keeps at most maxPlotPoints points, evenly spaced, and the last.
func thin(p []Point) []Point {
	if len(p) <= maxPlotPoints {
		return p
	}
	out := make([]Point, 0, maxPlotPoints+1)
	for i := range maxPlotPoints {
		out = append(out, p[i*len(p)/maxPlotPoints])
	}
	return append(out, p[len(p)-1])
}

func esc(s string) string {
	var b bytes.Buffer
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// roundTicks are the ticks from 0 to at most hi at a round step (1, 2 or 5
// times a power of ten) giving at most n+1 of them.
func roundTicks(hi float64, n int) []float64 {
	if !(hi > 0) {
		return []float64{0}
	}
	step := math.Pow(10, math.Floor(math.Log10(hi/float64(n))))
	for _, m := range []float64{1, 2, 5, 10} {
		if hi/(step*m) <= float64(n) {
			step *= m
			break
		}
	}
	var out []float64
	for k := 0; float64(k)*step <= hi*(1+1e-9); k++ {
		out = append(out, float64(k)*step)
	}
	return out
}

// tickLabel writes a round tick without float noise (0.30000000000000004).
func tickLabel(v float64) string {
	return strconv.FormatFloat(v, 'g', 6, 64)
}

// svgHead writes the document's start, its title and a legend of names.
func svgHead(sb *strings.Builder, title string, names []string) {
	fmt.Fprintf(sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(sb, `<text x="%d" y="24" font-size="16">%s</text>`+"\n", marginL, esc(title))
	// About 7 px a character at font size 12, and room for the swatch.
	step := 0
	for _, n := range names {
		step = max(step, 40+7*len(n))
	}
	for i, n := range names {
		lx := marginL + i*step
		fmt.Fprintf(sb, `<rect x="%d" y="38" width="24" height="10" fill="%s"/><text x="%d" y="48">%s</text>`+"\n",
			lx, seriesColours[i%len(seriesColours)], lx+30, esc(n))
	}
}

// Geometry of the one-panel plots.
const (
	chartY, chartH = 70, 460
)

// PlotJCT writes an SVG of each run's distribution of job completion
// time (the share of finished jobs done within a time), on a log scale of
// hours with ticks at powers of ten.
func PlotJCT(w io.Writer, title string, runs []*Result) error {
	var sb strings.Builder
	var names []string
	var all [][]float64
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		names = append(names, r.Summary.Strategy)
		var jct []float64
		for _, j := range r.Jobs {
			if j.Run >= 0 {
				v := max(j.End-j.Arrival, 1) / 3600 // at least a second: the scale is logarithmic
				jct = append(jct, v)
				lo, hi = min(lo, v), max(hi, v)
			}
		}
		slices.Sort(jct)
		all = append(all, jct)
	}
	svgHead(&sb, title+": job completion time", names)
	if math.IsInf(lo, 1) {
		lo, hi = 1.0/3600, 1
	}
	d0, d1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if d1 <= d0 {
		d1 = d0 + 1
	}
	innerW := float64(plotW - marginL - marginR)
	x := func(v float64) float64 { return float64(marginL) + (math.Log10(v)-d0)/(d1-d0)*innerW }
	y := func(f float64) float64 { return float64(chartY+chartH) - f*chartH }
	fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.0f" height="%d" fill="none" stroke="#888"/>`+"\n", marginL, chartY, innerW, chartH)
	for _, v := range []float64{0, 0.25, 0.5, 0.75, 1} {
		fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%.0f</text>`+"\n",
			marginL, y(v), float64(marginL)+innerW, y(v), marginL-6, y(v)+4, v*100)
	}
	for d := d0; d <= d1; d++ {
		v := math.Pow(10, d)
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x(v), chartY, x(v), chartY+chartH, x(v), chartY+chartH+16, tickLabel(v))
	}
	for i, jct := range all {
		var pts strings.Builder
		n := len(jct)
		for k := 0; k < n; k += max(1, n/maxPlotPoints) {
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(jct[k]), y(float64(k+1)/float64(n)))
		}
		if n > 0 {
			fmt.Fprintf(&pts, "%.1f,%.1f", x(jct[n-1]), y(1))
		}
		fmt.Fprintf(&sb, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n",
			seriesColours[i%len(seriesColours)], strings.TrimSpace(pts.String()))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d">finished jobs (%%)</text>`+"\n", marginL, chartY-8)
	fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle">job completion time (hours, log scale)</text>`+"\n", float64(marginL)+innerW/2, chartY+chartH+36)
	fmt.Fprintln(&sb, `</svg>`)
	_, err := io.WriteString(w, sb.String())
	return err
}

// PlotSlowdown writes an SVG of each run's mean slowdown against ideal by
// job size: one group of bars per size bucket, one bar per run.
func PlotSlowdown(w io.Writer, title string, runs []*Result) error {
	var sb strings.Builder
	var names []string
	top := 1.0
	for _, r := range runs {
		names = append(names, r.Summary.Strategy)
		for _, f := range r.Summary.BySize {
			top = max(top, f.SlowdownMean)
		}
	}
	svgHead(&sb, title+": slowdown against ideal by job size", names)
	ticks := roundTicks(top, 6)
	if last := ticks[len(ticks)-1]; last < top {
		ticks = append(ticks, last+ticks[1])
	}
	ymax := ticks[len(ticks)-1]
	innerW := float64(plotW - marginL - marginR)
	y := func(v float64) float64 { return float64(chartY+chartH) - v/ymax*chartH }
	fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.0f" height="%d" fill="none" stroke="#888"/>`+"\n", marginL, chartY, innerW, chartH)
	for _, v := range ticks {
		fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			marginL, y(v), float64(marginL)+innerW, y(v), marginL-6, y(v)+4, tickLabel(v))
	}
	group := innerW / float64(len(sizeBuckets))
	bar := group * 0.8 / float64(max(len(runs), 1))
	for b, sz := range sizeBuckets {
		gx := float64(marginL) + float64(b)*group
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", gx+group/2, chartY+chartH+16, sz.name)
		for i, r := range runs {
			for _, f := range r.Summary.BySize {
				if f.Bucket != sz.name {
					continue
				}
				bx := gx + group*0.1 + float64(i)*bar
				fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s GPUs: %.3f (%d jobs)</title></rect>`+"\n",
					bx, y(f.SlowdownMean), bar, float64(chartY+chartH)-y(f.SlowdownMean), seriesColours[i%len(seriesColours)],
					esc(r.Summary.Strategy), sz.name, f.SlowdownMean, f.Jobs)
			}
		}
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d">mean bounded slowdown (completion time over trace duration)</text>`+"\n", marginL, chartY-8)
	fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle">job size (GPUs)</text>`+"\n", float64(marginL)+innerW/2, chartY+chartH+36)
	fmt.Fprintln(&sb, `</svg>`)
	_, err := io.WriteString(w, sb.String())
	return err
}
