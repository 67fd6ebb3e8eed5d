package replay

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
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

var seriesColours = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7"}

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
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&sb, `<text x="%d" y="24" font-size="16">%s</text>`+"\n", marginL, esc(title))
	// Legend.
	for i, s := range series {
		lx := marginL + i*180
		fmt.Fprintf(&sb, `<line x1="%d" y1="44" x2="%d" y2="44" stroke="%s" stroke-width="3"/><text x="%d" y="48">%s</text>`+"\n",
			lx, lx+24, seriesColours[i%len(seriesColours)], lx+30, esc(s.Name))
	}
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
		for k := 0; k <= 5; k++ {
			t := span * float64(k) / 5
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle">%.3g</text>`+"\n", x(t), pn.y+panelH+16, t/per)
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
