package replay

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// plotRuns are two small runs with finished jobs of several sizes.
func plotRuns() []*Result {
	mk := func(name string, jcts []float64, slow map[string]float64) *Result {
		r := &Result{Summary: Summary{Strategy: name}}
		for i, j := range jcts {
			r.Jobs = append(r.Jobs, JobResult{ID: name + string(rune('a'+i)), GPUs: 1, Arrival: 100, Run: j / 2, End: 100 + j})
		}
		for _, b := range sizeBuckets {
			if v, ok := slow[b.name]; ok {
				r.Summary.BySize = append(r.Summary.BySize, SizeFigures{Bucket: b.name, JobFigures: JobFigures{Jobs: 3, SlowdownMean: v}})
			}
		}
		return r
	}
	return []*Result{
		mk("topology-aware", []float64{30, 600, 3600, 7200, 86400}, map[string]float64{"1": 1, "2-4": 1.1, "9-32": 1.3}),
		mk("blind", []float64{60, 900, 5400, 36000, 172800}, map[string]float64{"1": 1.2, "2-4": 1.6, "9-32": 2.7}),
	}
}

func TestPlotJCTGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := PlotJCT(&buf, "tiny & trace", plotRuns()); err != nil {
		t.Fatal(err)
	}
	golden(t, "jct.svg", buf.Bytes())
}

func TestPlotSlowdownGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := PlotSlowdown(&buf, "tiny & trace", plotRuns()); err != nil {
		t.Fatal(err)
	}
	golden(t, "slowdown.svg", buf.Bytes())
}

func TestRoundTicks(t *testing.T) {
	for _, tc := range []struct {
		hi   float64
		want []float64
	}{
		{1, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{2.7, []float64{0, 0.5, 1, 1.5, 2, 2.5}},
		{37, []float64{0, 10, 20, 30}},
		{820, []float64{0, 200, 400, 600, 800}},
		{0, []float64{0}},
	} {
		got := roundTicks(tc.hi, 6)
		if len(got) != len(tc.want) {
			t.Errorf("roundTicks(%v) = %v, want %v", tc.hi, got, tc.want)
			continue
		}
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("roundTicks(%v) = %v, want %v", tc.hi, got, tc.want)
				break
			}
		}
		for _, v := range got {
			if l := tickLabel(v); len(l) > 4 {
				t.Errorf("tick %v is labelled %q: not round", v, l)
			}
		}
	}
}

// TestPlotsRender renders every plot to PNG with rsvg-convert (package
// librsvg2-bin), which refuses an SVG that is not well-formed, and checks
// the image's size.
func TestPlotsRender(t *testing.T) {
	bin, err := exec.LookPath("rsvg-convert")
	if err != nil {
		t.Skip("rsvg-convert not installed (Debian/Ubuntu package librsvg2-bin)")
	}
	series := []Series{{"topology-aware", []Point{{T: 0}, {T: 7200, Allocated: 0.5}}}, {"blind", []Point{{T: 0}, {T: 7200, Allocated: 0.7}}}}
	for name, plot := range map[string]func(io.Writer) error{
		"replay": func(w io.Writer) error { return Plot(w, "t", series) },
		"jct":    func(w io.Writer) error { return PlotJCT(w, "t", plotRuns()) },
		"slow":   func(w io.Writer) error { return PlotSlowdown(w, "t", plotRuns()) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			svg, png := filepath.Join(dir, name+".svg"), filepath.Join(dir, name+".png")
			var buf bytes.Buffer
			if err := plot(&buf); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(svg, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(bin, "-o", png, svg).CombinedOutput(); err != nil {
				t.Fatalf("rsvg-convert: %v: %s", err, out)
			}
			w, h, err := pngSize(png)
			if err != nil {
				t.Fatal(err)
			}
			if w != plotW || h != plotH {
				t.Errorf("PNG %d×%d, want %d×%d", w, h, plotW, plotH)
			}
		})
	}
}

// pngSize reads a PNG's width and height from its IHDR chunk.
func pngSize(path string) (int, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	if len(data) < 24 || !slices.Equal(data[:8], []byte("\x89PNG\r\n\x1a\n")) || string(data[12:16]) != "IHDR" {
		return 0, 0, errors.New(path + ": not a PNG")
	}
	return int(binary.BigEndian.Uint32(data[16:20])), int(binary.BigEndian.Uint32(data[20:24])), nil
}
