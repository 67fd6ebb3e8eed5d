package nccltests

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden")

// render is what the reader extracted from a file, one line a row.
func render(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "file %s: %d tests, %d rows, nGpus %d\n", filepath.Base(r.File), len(r.Tests), len(r.Rows), r.GPUs)
	for i, t := range r.Tests {
		fmt.Fprintf(&b, "test %d at line %d: %q nGpus %d ranks %d check %q, %d rows\n", i+1, t.Line, t.Collective, t.GPUs, t.Ranks, t.WrongColumn, len(t.Rows))
		for _, row := range t.Rows {
			fmt.Fprintf(&b, "  %d: %g %g %s %q %d | %g %g %g %g | %g %g %g %g\n", row.Line, row.Bytes, row.Count, row.Type, row.Redop, row.Root,
				row.TimeOutUS, row.AlgOutGBps, row.BusOutGBps, row.WrongOut, row.TimeInUS, row.AlgInGBps, row.BusInGBps, row.WrongIn)
		}
	}
	return b.String()
}

// TestGolden reads every file of testdata (real nccl-tests output,
// SOURCES.md names each one's source) and compares what it extracted with
// testdata/golden/<file>.golden (go test -update rewrites them).
func TestGolden(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			r, err := Parse(file, data)
			if err != nil {
				t.Fatal(err)
			}
			got := render(r)
			golden := filepath.Join("testdata", "golden", filepath.Base(file)+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("%s differs from %s (go test -update rewrites it); got:\n%s", file, golden, got)
			}
		})
	}
}

// The features of real logs, each on the file that has it.
func TestRealLogs(t *testing.T) {
	t.Parallel()
	read := func(name string) Result {
		t.Helper()
		file := filepath.Join("testdata", name)
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Parse(file, data)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Size-0 rows of all_gather on 2 GPUs (-b 8 < 2 × 4 bytes).
	ag := read("rtx2080ti-2gpu-pcie-no-p2p_all_gather_autodl-blog.txt")
	if len(ag.Tests) != 1 || ag.Tests[0].Collective != "all_gather" || ag.Tests[0].Ranks != 2 || ag.Rows[0].Bytes != 0 || ag.Rows[1].Bytes != 0 || ag.Rows[2].Bytes != 32 {
		t.Errorf("all_gather: %s", render(ag))
	}
	// Six runs in one log, each named by its command line; a 1-GPU one.
	six := read("rtx2080ti-2gpu-pcie-no-p2p_six-collectives_autodl-blog.txt")
	var names []string
	for _, x := range six.Tests {
		names = append(names, fmt.Sprintf("%s/%d", x.Collective, x.Ranks))
	}
	if got := strings.Join(names, " "); got != "all_reduce/2 all_gather/2 broadcast/2 reduce/2 reduce/1 alltoall/2" {
		t.Errorf("tests %s", got)
	}
	// MPI, one GPU a process: the ranks from the device lines of every
	// process.
	if b := read("b200-2node-1gpu-each_all_gather_dranet-doc.txt"); b.GPUs != 1 || b.Tests[0].Ranks != 2 || b.Tests[0].Collective != "all_gather" {
		t.Errorf("MPI: %s", render(b))
	}
	// OpenMPI's tags, NCCL INFO lines between the rows, the 2019-22
	// layout (redop, no root, an error column).
	efa := read("a100-2node-16gpu-efa-openmpi-tags_all_reduce_aws-efa-eks.txt")
	if len(efa.Rows) != 30 || efa.Tests[0].Ranks != 16 || efa.Tests[0].WrongColumn != "error" || efa.Rows[0].Redop != "sum" || efa.Rows[0].Root != -1 {
		t.Errorf("OpenMPI tags: %d rows %+v", len(efa.Rows), efa.Tests[0].Rows[:1])
	}
	// Open MPI tags each write, so mid-row too (two rows as published in
	// github.com/KeitaW/p5-nccl-test-2024-07-19, nccl-test-output-v2.22.3-1.log,
	// lines 2903 and 2936).
	mid, err := Parse("p5.txt", []byte("[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"+
		"[1,0]<stdout>: 17179869184    4294967296     float     sum      -1[1,0]<stdout>:    66023  260.21  487.90      0[1,0]<stdout>:    65990  260.34  488.14      0\n"))
	if err != nil || len(mid.Rows) != 1 || mid.Rows[0].Bytes != 17179869184 || mid.Rows[0].Root != -1 || mid.Rows[0].TimeOutUS != 66023 || mid.Rows[0].BusInGBps != 488.14 {
		t.Errorf("Open MPI tags mid-row: %v %+v", err, mid.Rows)
	}
	// CRLF reads as LF.
	data, err := os.ReadFile(filepath.Join("testdata", "rtx2080ti-2gpu-pcie-no-p2p_all_gather_autodl-blog.txt"))
	if err != nil {
		t.Fatal(err)
	}
	crlf, err := Parse("crlf.txt", []byte(strings.ReplaceAll(string(data), "\n", "\r\n")))
	if err != nil || render(crlf)[strings.IndexByte(render(crlf), '\n'):] != render(ag)[strings.IndexByte(render(ag), '\n'):] {
		t.Errorf("CRLF: %v", err)
	}
}

const row = "  134217728      33554432     float     sum      -1   3912.9   34.30   64.31      0   3932.8   34.13   63.99      0\n"

// Layouts nccl-tests printed over the years, one row each (nccl-tests'
// src/common.cu and src/util.cu print them; see the package doc).
func TestLayouts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     Row
	}{
		{"2017 all_reduce, ms", "# bytes N type op time algbw busbw res time algbw busbw res\n" +
			"    10000000      2500000   float     sum    1.234  8.10  14.18    0e+00    1.200  8.33  14.58    0e+00\n",
			Row{Line: 2, Bytes: 1e7, Count: 2.5e6, Type: "float", Redop: "sum", Root: -1, TimeOutUS: 1234, AlgOutGBps: 8.1, BusOutGBps: 14.18, TimeInUS: 1200, AlgInGBps: 8.33, BusInGBps: 14.58}},
		{"2019 all_gather, no header", "           0             0   float    57.30    0.00    0.00  0e+00    57.09    0.00    0.00  0e+00\n",
			Row{Line: 1, Type: "float", Root: -1, TimeOutUS: 57.3, TimeInUS: 57.09}},
		{"2019 broadcast root", "#  size count type root time algbw busbw error time algbw busbw error\n" +
			"     1048576        262144     float       0    113.8    9.22    9.22  0e+00    288.1    3.64    3.64    N/A\n",
			Row{Line: 2, Bytes: 1 << 20, Count: 262144, Type: "float", Root: 0, TimeOutUS: 113.8, AlgOutGBps: 9.22, BusOutGBps: 9.22, TimeInUS: 288.1, AlgInGBps: 3.64, BusInGBps: 3.64, WrongIn: -1}},
		{"copybw", "# size count type redop root time algbw busbw copybw #wrong time algbw busbw copybw #wrong\n" +
			"     1048576        262144     float     sum      -1    20.00   52.43   91.75   10.00      0    20.00   52.43   91.75   10.00      0\n",
			Row{Line: 2, Bytes: 1 << 20, Count: 262144, Type: "float", Redop: "sum", Root: -1, TimeOutUS: 20, AlgOutGBps: 52.43, BusOutGBps: 91.75, TimeInUS: 20, AlgInGBps: 52.43, BusInGBps: 91.75}},
		{"timestamp and cputime", "# size count type redop root cputime algbw busbw #wrong cputime algbw busbw #wrong timestamp\n" +
			"     1048576        262144     float     sum      -1    20.00   52.43   91.75      0    20.00   52.43   91.75    N/A 2025-10-28 12:34:56\n",
			Row{Line: 2, Bytes: 1 << 20, Count: 262144, Type: "float", Redop: "sum", Root: -1, TimeOutUS: 20, AlgOutGBps: 52.43, BusOutGBps: 91.75, TimeInUS: 20, AlgInGBps: 52.43, BusInGBps: 91.75, WrongIn: -1}},
		{"per-iteration", "# size count type redop root time algbw busbw #wrong i_min i_max i_p99 i_cv% time algbw busbw #wrong i_min i_max i_p99 i_cv%\n" +
			"     1048576        262144     float     sum      -1    20.00   52.43   91.75      0    19.00    21.00    21.00     1.50    20.00   52.43   91.75      0    19.00    21.00    21.00     1.50\n",
			Row{Line: 2, Bytes: 1 << 20, Count: 262144, Type: "float", Redop: "sum", Root: -1, TimeOutUS: 20, AlgOutGBps: 52.43, BusOutGBps: 91.75, TimeInUS: 20, AlgInGBps: 52.43, BusInGBps: 91.75}},
		{"srun label", "0: " + row, Row{Line: 1, Bytes: 134217728, Count: 33554432, Type: "float", Redop: "sum", Root: -1, TimeOutUS: 3912.9, AlgOutGBps: 34.30, BusOutGBps: 64.31, TimeInUS: 3932.8, AlgInGBps: 34.13, BusInGBps: 63.99}},
		{"Intel MPI tags mid-line", "[0]    134217728      33554432     float     sum      -1[0]   3912.9   34.30   64.31      0[0]   3932.8   34.13   63.99      0\n",
			Row{Line: 1, Bytes: 134217728, Count: 33554432, Type: "float", Redop: "sum", Root: -1, TimeOutUS: 3912.9, AlgOutGBps: 34.30, BusOutGBps: 64.31, TimeInUS: 3932.8, AlgInGBps: 34.13, BusInGBps: 63.99}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse("f.txt", []byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Rows) != 1 || r.Rows[0] != tc.want {
				t.Fatalf("got %+v\nwant %+v", r.Rows, tc.want)
			}
		})
	}
	// Another process's rows (a build without MPI under srun: each runs
	// alone) are not this run's.
	r, err := Parse("f.txt", []byte("0: "+row+"1: "+row+"1: "+row))
	if err != nil || len(r.Rows) != 1 {
		t.Fatalf("labels: %d rows, %v", len(r.Rows), err)
	}
	// Sizes that start over: a second run.
	r, err = Parse("f.txt", []byte(row+strings.Replace(row, "134217728", "134217720", 1)))
	if err != nil || len(r.Tests) != 2 {
		t.Fatalf("a second run: %+v %v", r.Tests, err)
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	gather := "# Collective test starting: all_gather_perf\n#  Rank  0 Group  0 Pid 1 on h device  0 [0000:01:00] GPU\n#  Rank  1 Group  0 Pid 1 on h device  1 [0000:02:00] GPU\n" +
		"   268435456      33554432     float    none      -1    20235   13.27    6.63      0    19164   14.01    7.00      0\n"
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"empty", "", []string{"f.txt", "no rows"}},
		{"prose only", "# nThread 1 nGpus 8\nhello\n8 GPUs on 2 nodes\n", []string{"no rows"}},
		{"cut off", row + "  268435456      67108864     float     sum      -1   7201.7   37.27\n", []string{"f.txt:2:", "cut off"}},
		{"cut off after the count", row + "  1073741824     2684\n", []string{"f.txt:2:", "cut off"}},
		{"negative time", strings.Replace(row, "3912.9", "-3912.9", 1), []string{"f.txt:1:", "time", "negative"}},
		{"zero time", strings.Replace(row, "3932.8", "0", 1), []string{"f.txt:1:", "time 0", "takes time"}},
		{"negative busbw", strings.Replace(row, "64.31", "-64.31", 1), []string{"f.txt:1:", "busbw", "negative"}},
		{"negative size", strings.Replace(row, "134217728", "-134217728", 1), []string{"f.txt:1:", "size"}},
		{"not a number", strings.Replace(row, "64.31", "N/A", 1), []string{"f.txt:1:", "field 8", `"N/A"`}},
		{"NaN", strings.Replace(row, "63.99", "NaN", 1), []string{"f.txt:1:", "field 12"}},
		{"busbw against the factor of the ranks", strings.Replace(gather, "6.63", "13.27", 1),
			[]string{"f.txt:4:", "out-of-place busbw 13.27", "algbw 13.27 × 0.5", "all_gather factor (n-1)/n for 2 ranks", "Using devices"}},
		{"busbw no rank count gives", "./build/all_reduce_perf -b 8\n" + strings.Replace(row, "64.31", "70.00", 1),
			[]string{"f.txt:2:", "no rank count", "all_reduce", "2(n-1)/n"}},
		// Issue 50, bad input: a time that is not the one the row's
		// algorithm bandwidth was computed from (algbw = size / time).
		{"time against algbw", strings.Replace(row, "3912.9", "1956.4", 1),
			[]string{"f.txt:1:", "out-of-place algbw 34.3", "size 134217728 / time 1956.4 µs = 68.6", "edited"}},
		{"algbw and busbw against the time", strings.NewReplacer("34.13", "68.26", "63.99", "127.98").Replace(row),
			[]string{"f.txt:1:", "in-place algbw 68.26", "time 3932.8 µs = 34.13"}},
		{"2017 layout, time in ms", "# bytes N type op time algbw busbw res time algbw busbw res\n" +
			"    10000000      2500000   float     sum    2.468  8.10  14.18    0e+00    1.200  8.33  14.58    0e+00\n",
			[]string{"f.txt:2:", "out-of-place algbw 8.1", "time 2468 µs = 4.052"}},
		{"busbw off its implied rank count", "./build/all_reduce_perf -b 8\n" + row + strings.NewReplacer("134217728", "268435456", "3912.9", "7825.8", "3932.8", "7865.6", "64.31", "60.00").Replace(row),
			[]string{"f.txt:3:", "busbw 60", "implied"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("f.txt", []byte(tc.in))
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
	r, err := Parse("f.txt", []byte("# nThread 1 nGpus 8 minBytes 8\n0: "+row))
	if err != nil || r.GPUs != 8 || len(r.Rows) != 1 || r.Rows[0].Line != 2 {
		t.Fatalf("rank prefix and header: %+v %v", r, err)
	}
	if _, err := Parse("f.txt", []byte(gather)); err != nil {
		t.Fatalf("the consistent all_gather: %v", err)
	}
}

// ncclTestsLike: the file holds nccl-tests' column header or a row of
// it (size count type ...), so it is nccl-tests output, complete or not.
var ncclTestsLike = regexp.MustCompile(`(?m)(#\s+(size|bytes)\s+(count|N)\s+type\s)|(^(\d+:|\[[\d,]+\](<stdout>:)?)?\s*\d+\s+\d+\s+[a-z][a-z0-9_]*\s+(\S+\s+){7})`)

// CorpusFiles are the measurement files of internal/collective/testdata
// and of this package's testdata, globbed so that files added later are
// covered.
func corpusFiles(t testing.TB) []string {
	var files []string
	for _, dir := range []string{"testdata", filepath.Join("..", "..", "collective", "testdata")} {
		m, err := filepath.Glob(filepath.Join(dir, "*.txt"))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatal("no measurement files")
	}
	return files
}

// TestCorpus reads every measurement file: one that nccl-tests printed
// reads; one whose published text was cut off (*.partial.*, the cut
// marked by a "# [partial: ...]" line) reads up to the cut or is refused
// naming its file and line; the others (tables from web pages, torch
// benchmarks) are refused naming the file.
func TestCorpus(t *testing.T) {
	t.Parallel()
	read := 0
	for _, file := range corpusFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Parse(file, data)
		partial := strings.Contains(filepath.Base(file), ".partial.")
		switch {
		case err != nil && !strings.HasPrefix(err.Error(), file):
			t.Errorf("%s: refused without naming the file: %v", file, err)
		case partial && err != nil && !strings.HasPrefix(err.Error(), file+":"):
			t.Errorf("%s: refused without naming the line: %v", file, err)
		case !partial && ncclTestsLike.Match(data) && err != nil:
			t.Errorf("%s: nccl-tests output refused: %v", file, err)
		case err == nil:
			read++
			for _, row := range r.Rows {
				if row.Bytes < 0 || row.TimeOutUS < 0 || row.BusBW() < 0 {
					t.Errorf("%s:%d: %+v", file, row.Line, row)
				}
			}
		}
	}
	t.Logf("%d files read", read)
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(row))
	f.Add([]byte("# nThread 1 nGpus 8\n0: " + row))
	f.Add([]byte(row + "  268435456      67108864     float     sum      -1   7201.7"))
	for _, file := range corpusFiles(f) {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse("f.txt", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.txt") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		n := 0
		for _, x := range r.Tests {
			n += len(x.Rows)
			for i, row := range x.Rows {
				if row.Bytes < 0 || row.TimeOutUS < 0 || row.TimeInUS < 0 || row.BusBW() < 0 || (row.Bytes > 0 && (row.TimeOutUS == 0 || row.TimeInUS == 0)) ||
					(i > 0 && row.Bytes < x.Rows[i-1].Bytes) || row.Line < 1 {
					t.Fatalf("row %+v taken", row)
				}
			}
		}
		if n != len(r.Rows) || n == 0 {
			t.Fatalf("%d rows in tests, %d in all", n, len(r.Rows))
		}
	})
}
