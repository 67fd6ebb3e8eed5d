// Package nccltests reads the text output of NVIDIA's nccl-tests
// (all_reduce_perf, all_gather_perf, reduce_scatter_perf, sendrecv_perf
// and the others): one row per message size, with the out-of-place and
// in-place time, algorithm and bus bandwidth. Calibration
// (internal/collective) fits the cost model to what a cluster measured
// with them.
//
// It reads every layout nccl-tests has printed (src/common.cu, later
// src/util.cu, of github.com/NVIDIA/nccl-tests):
//
//	2017      bytes N type [op]            time(ms) algbw busbw res    ×2
//	2019-22   size count type [redop|root] time algbw busbw error  ×2
//	2022-     size count type redop root   time algbw busbw #wrong ×2
//	2024- -C  ... time algbw busbw copybw #wrong ×2
//	2025- -S  ... ×2, then a timestamp (date and time)
//	2026- -I  ... time algbw busbw #wrong i_min i_max i_p99 i_cv% ×2
//
// The header line names the columns where the file has one; a row without
// one is read by its number of fields. Around the table it takes what real
// logs hold: rows of size 0 (all_gather and reduce_scatter below ranks ×
// the type size) and repeated sizes, N/A in #wrong (-c 0, sendrecv's
// in-place), NCCL INFO and WARN lines, shell prompts and prose, the
// footer, CRLF line ends, rank prefixes of MPI and Slurm launches ("0: ",
// "[1,0]<stdout>:", "[0]"; only the first rank's rows are kept when
// several print), and several tests in one log: a new test starts at each
// *_perf command line, "# Collective test starting" line, "# nThread"
// header or column header after rows, and where the sizes start over.
// Each test is named by the binary that printed it (all_gather), else by
// the file's name.
//
// A row that is cut off, a number that cannot be (a negative or zero
// time, a negative bandwidth or size, NaN), an algorithm bandwidth that
// is not the size over the time (nccl-tests computes both from one
// measured time; the rounding of each as printed and 1% are allowed), and
// a bus bandwidth that is not the algorithm bandwidth times the
// collective's factor for the test's rank count (2(n-1)/n for all_reduce,
// (n-1)/n for all_gather, reduce_scatter and alltoall, 1 for sendrecv,
// broadcast and reduce: the file was edited, or is not what its name
// says) are refused with the file, the line and the reason.
package nccltests

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Row is one measured message size.
type Row struct {
	Line  int
	Bytes float64
	Count float64
	Type  string
	// Redop is "" in layouts without the column; Root -1 when none.
	Redop string
	Root  int
	// Out-of-place and in-place time (µs), algorithm and bus bandwidth
	// (GB/s) and the data check's column (#wrong elements, or the older
	// layouts' largest error); -1 where it printed N/A (not checked).
	TimeOutUS, AlgOutGBps, BusOutGBps, WrongOut float64
	TimeInUS, AlgInGBps, BusInGBps, WrongIn     float64
}

// BusBW is the better of the row's two bus bandwidths, as nccl-tests'
// summary reads them.
func (r Row) BusBW() float64 { return max(r.BusOutGBps, r.BusInGBps) }

// Test is one run of an nccl-tests binary in a file.
type Test struct {
	// Collective is the binary's name without _perf (all_reduce,
	// all_gather, alltoall, ...), else the collective the file's name
	// names, else "".
	Collective string
	// Line is the line the test starts at (its command line or header),
	// or its first row's.
	Line int
	// GPUs is the header's nGpus (GPUs per process), 0 without one.
	GPUs int
	// Ranks is the number of ranks in rank 0's communicator, from the
	// "# Using devices" lines; 0 when the log has none.
	Ranks int
	// WrongColumn names the data check's column: "#wrong" (a count of
	// wrong elements), "error" or "res" (older layouts: the largest
	// difference).
	WrongColumn string
	Rows        []Row
}

// Result is one file's tests, and all their rows in file order.
type Result struct {
	File string
	// GPUs is the largest nGpus of the headers, 0 when none has one.
	GPUs  int
	Tests []Test
	Rows  []Row
}

// maxRows bounds one file.
const maxRows = 1 << 16

// layout is where a row's values are.
type layout struct {
	prefix, side          int // fields before the first time column; fields per side
	typ, redop, root      int // prefix indexes (-1: none)
	time, alg, bus, wrong int // side indexes
	wrongName             string
	ms                    bool // times in milliseconds (the 2017 layout)
	cpuTime               bool // the time column is the host's (cputime), not the one algbw is computed from
	fromHeader            bool
}

// byFields is the layout of a row without a header, by its number of
// fields (a timestamp's two dropped).
func byFields(n int) (layout, bool) {
	l := layout{typ: 2, redop: -1, root: -1, alg: 1, bus: 2, wrong: 3, wrongName: "#wrong"}
	switch n {
	case 11: // 2019-22 all_gather, sendrecv
		l.prefix, l.side, l.wrongName = 3, 4, "error"
	case 12: // 2019-22 all_reduce, reduce_scatter, alltoall (redop)
		l.prefix, l.side, l.redop, l.wrongName = 4, 4, 3, "error"
	case 13:
		l.prefix, l.side, l.redop, l.root = 5, 4, 3, 4
	case 15: // -C copybw
		l.prefix, l.side, l.redop, l.root, l.wrong = 5, 5, 3, 4, 4
	case 21: // -I per-iteration
		l.prefix, l.side, l.redop, l.root = 5, 8, 3, 4
	default:
		return l, false
	}
	return l, true
}

// fromHeader reads the column header ("size count type redop root time
// algbw busbw #wrong time ..."), the '#'s dropped.
func fromHeader(cols []string) (layout, bool) {
	l := layout{typ: -1, redop: -1, root: -1, time: -1, alg: -1, bus: -1, wrong: -1, fromHeader: true}
	first := slices.IndexFunc(cols, isTimeCol)
	if first < 2 {
		return l, false
	}
	next := slices.IndexFunc(cols[first+1:], isTimeCol)
	if next < 0 {
		return l, false
	}
	l.prefix, l.side = first, next+1
	for i, c := range cols[:first] {
		switch c {
		case "type":
			l.typ = i
		case "redop", "op":
			l.redop = i
		case "root":
			l.root = i
		}
	}
	for i, c := range cols[first : first+l.side] {
		switch c {
		case "time", "cputime":
			l.time, l.cpuTime = i, c == "cputime"
		case "algbw":
			l.alg = i
		case "busbw":
			l.bus = i
		case "#wrong", "error", "res", "wrong":
			l.wrong, l.wrongName = i, c
		}
	}
	l.ms = cols[0] == "bytes"
	return l, l.typ >= 0 && l.alg >= 0 && l.bus >= 0 && len(cols) >= first+2*l.side
}

func isTimeCol(c string) bool { return c == "time" || c == "cputime" }

var (
	openMPITag = regexp.MustCompile(`^\[\d+,(\d+)\]<std(out|err)>:`)
	intelTag   = regexp.MustCompile(`^\[(\d+)\]`)
	perfBinary = regexp.MustCompile(`^([a-z0-9_]+)_perf(_mpi)?$`)
	dateField  = regexp.MustCompile(`^\d{4}-\d\d-\d\d$`)
	clockField = regexp.MustCompile(`^\d\d:\d\d:\d\d`)
)

// parser is Parse's state.
type parser struct {
	file    string
	res     Result
	cur     *Test
	lay     layout
	label   string // the rank prefix of the rows kept ("": none seen)
	ranks   map[int]int
	rank0G  int // rank 0's group
	cutRank bool
	line    int
}

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", p.file, p.line, fmt.Sprintf(format, args...))
}

// newTest starts a test; the collective and layout carry over unless
// told.
func (p *parser) newTest(collective string) error {
	if err := p.finish(); err != nil {
		return err
	}
	p.res.Tests = append(p.res.Tests, Test{Collective: collective, Line: p.line})
	p.cur = &p.res.Tests[len(p.res.Tests)-1]
	p.lay = layout{}
	p.label = ""
	p.ranks, p.rank0G, p.cutRank = map[int]int{}, 0, false
	return nil
}

// finish closes the current test: its rank count, its collective from
// the file's name, and the bus bandwidths checked against both.
func (p *parser) finish() error {
	t := p.cur
	if t == nil {
		return nil
	}
	if t.Collective == "" {
		t.Collective = collectiveOfName(p.file)
	}
	if !p.cutRank {
		for _, g := range p.ranks {
			if g == p.rank0G {
				t.Ranks++
			}
		}
	}
	if len(t.Rows) == 0 {
		p.res.Tests = p.res.Tests[:len(p.res.Tests)-1]
		p.cur = nil
		return nil
	}
	if t.Line == 0 {
		t.Line = t.Rows[0].Line // the file's first test, without a command line
	}
	return p.checkFactor(t)
}

// Parse reads nccl-tests output; file names it in errors.
func Parse(file string, data []byte) (Result, error) {
	p := &parser{file: file, res: Result{File: file}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if err := p.newTest(""); err != nil {
		return p.res, err
	}
	for sc.Scan() {
		p.line++
		if err := p.readLine(sc.Text()); err != nil {
			return p.res, err
		}
	}
	if err := sc.Err(); err != nil {
		return p.res, fmt.Errorf("%s: %w", file, err)
	}
	if err := p.finish(); err != nil {
		return p.res, err
	}
	for _, t := range p.res.Tests {
		p.res.Rows = append(p.res.Rows, t.Rows...)
	}
	if len(p.res.Rows) == 0 {
		return p.res, fmt.Errorf("%s: no rows: expected the output of an nccl-tests binary (size count type redop root time algbw busbw ...)", file)
	}
	return p.res, nil
}

func (p *parser) readLine(text string) error {
	label := ""
	if m := openMPITag.FindStringSubmatch(text); m != nil {
		// Open MPI's --tag-output tags each write, so a row that
		// nccl-tests prints in several writes has the tag mid-line too.
		label, text = m[1], strings.ReplaceAll(text[len(m[0]):], m[0], " ")
	} else if m := intelTag.FindStringSubmatch(text); m != nil {
		// Intel MPI's -prepend-rank tags each write, so mid-line too.
		label, text = m[1], strings.ReplaceAll(text, m[0], " ")
	}
	f := strings.Fields(text)
	if len(f) > 0 && len(f[0]) > 1 && strings.HasSuffix(f[0], ":") {
		if _, err := strconv.Atoi(strings.TrimSuffix(f[0], ":")); err == nil {
			label, f = strings.TrimSuffix(f[0], ":"), f[1:] // srun --label
		}
	}
	if len(f) == 0 {
		return nil
	}
	if strings.HasPrefix(f[0], "#") {
		return p.comment(f)
	}
	if c := commandCollective(f); c != "" {
		if len(p.cur.Rows) > 0 {
			return p.newTest(c)
		}
		p.cur.Collective, p.cur.Line = c, p.line
		return nil
	}
	if !rowLike(f) {
		return nil // prose, NCCL INFO, a shell prompt
	}
	if label != "" {
		if p.label == "" {
			p.label = label
		} else if label != p.label {
			return nil // another process's own run
		}
	}
	return p.row(f)
}

// comment reads the '#' lines nccl-tests prints: headers, rank lines,
// the column header; the footer and the rest are skipped.
func (p *parser) comment(f []string) error {
	var w []string
	for _, s := range f {
		if s = strings.TrimLeft(s, "#"); s != "" || len(w) > 0 {
			w = append(w, s)
		}
	}
	// "#wrong" lost its '#': put it back for the header.
	for i, s := range w {
		if s == "wrong" {
			w[i] = "#wrong"
		}
	}
	if len(w) == 0 {
		return nil
	}
	line := strings.Join(w, " ")
	switch {
	case strings.HasPrefix(line, "Collective test starting:"):
		c := ""
		if len(w) > 3 {
			c = binaryCollective(w[3])
		}
		return p.newTest(c)
	case w[0] == "nThread":
		if len(p.cur.Rows) > 0 {
			if err := p.newTest(p.cur.Collective); err != nil {
				return err
			}
		}
		p.cur.GPUs = gpusOf(w)
		p.res.GPUs = max(p.res.GPUs, p.cur.GPUs)
	case w[0] == "Rank" && len(w) > 1:
		r, err := strconv.Atoi(w[1])
		if err != nil {
			return nil
		}
		g := 0
		if len(w) > 3 && w[2] == "Group" {
			g, _ = strconv.Atoi(w[3])
		}
		if r == 0 {
			p.rank0G = g
		}
		p.ranks[r] = g
		if strings.HasSuffix(line, "...") {
			p.cutRank = true // nccl-tests cut a long device list
		}
	case slices.Contains(w, "algbw") && slices.Contains(w, "busbw"):
		l, ok := fromHeader(w)
		if !ok {
			return nil
		}
		if len(p.cur.Rows) > 0 {
			if err := p.newTest(p.cur.Collective); err != nil {
				return err
			}
		}
		p.lay = l
		p.cur.WrongColumn = l.wrongName
	}
	return nil
}

// commandCollective is the collective of a command line that runs an
// nccl-tests binary (./build/all_gather_perf -b 8 ...), "" for another
// line.
func commandCollective(f []string) string {
	for _, s := range f {
		if c := binaryCollective(s); c != "" {
			return c
		}
	}
	return ""
}

func binaryCollective(s string) string {
	m := perfBinary.FindStringSubmatch(filepath.Base(strings.ReplaceAll(s, `\`, "/")))
	if m == nil {
		return ""
	}
	return m[1]
}

// collectiveOfName is the collective a file's name names, "" for none.
func collectiveOfName(file string) string {
	base := strings.ToLower(filepath.Base(file))
	for _, c := range []string{"all_reduce", "all_gather", "reduce_scatter", "sendrecv", "alltoall", "broadcast"} {
		if strings.Contains(base, c) {
			return c
		}
	}
	return ""
}

// rowLike: a size and a count (integers), then the type (a word).
func rowLike(f []string) bool {
	if len(f) < 2 || !isInt(f[0]) || !isInt(f[1]) {
		return false
	}
	if len(f) == 2 {
		return true // cut off after the count
	}
	_, err := strconv.ParseFloat(f[2], 64)
	return err != nil && f[2] != "N/A"
}

func isInt(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

func (p *parser) row(f []string) error {
	if n := len(f); n >= 4 && dateField.MatchString(f[n-2]) && clockField.MatchString(f[n-1]) {
		f = f[:n-2] // -S: the timestamp
	}
	l := p.lay
	if !l.fromHeader {
		var ok bool
		if l, ok = byFields(len(f)); !ok {
			return p.errf("a row of %d fields, expected 11 to 13 (size count type [redop] [root], then time algbw busbw #wrong out of place and in place): the file is cut off here", len(f))
		}
	}
	if want := l.prefix + 2*l.side; len(f) != want {
		if len(f) < want {
			return p.errf("a row of %d fields, the header has %d: the file is cut off here", len(f), want)
		}
		return p.errf("a row of %d fields, the header has %d", len(f), want)
	}
	if len(p.res.Rows)+countRows(p.res.Tests) >= maxRows {
		return p.errf("more than %d rows", maxRows)
	}
	size, _ := strconv.ParseFloat(f[0], 64)
	count, _ := strconv.ParseFloat(f[1], 64)
	if size < 0 || count < 0 {
		return p.errf("size %s, count %s: a byte count is not negative", f[0], f[1])
	}
	r := Row{Line: p.line, Bytes: size, Count: count, Type: f[l.typ], Root: -1}
	if l.redop >= 0 {
		r.Redop = f[l.redop]
	}
	if l.root >= 0 {
		root, err := strconv.Atoi(f[l.root])
		if err != nil {
			return p.errf("field %d (root) = %q: expected a rank", l.root+1, f[l.root])
		}
		r.Root = root
	}
	for s, side := range []string{"out-of-place", "in-place"} {
		base := l.prefix + s*l.side
		num := func(i int, what string, na bool) (float64, error) {
			if i < 0 {
				return -1, nil
			}
			v := f[base+i]
			if na && v == "N/A" {
				return -1, nil
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
				return 0, p.errf("field %d (%s %s) = %q: expected a number", base+i+1, side, what, v)
			}
			if x < 0 {
				return 0, p.errf("field %d (%s %s) = %s: cannot be negative", base+i+1, side, what, v)
			}
			return x, nil
		}
		t, err := num(l.time, "time", false)
		if err != nil {
			return err
		}
		if l.ms {
			t *= 1000
		}
		a, err := num(l.alg, "algbw", false)
		if err != nil {
			return err
		}
		b, err := num(l.bus, "busbw", false)
		if err != nil {
			return err
		}
		w, err := num(l.wrong, l.wrongName, true)
		if err != nil {
			return err
		}
		if t == 0 && size > 0 {
			return p.errf("%s time %s µs for %s bytes: moving data takes time", side, f[base+l.time], f[0])
		}
		if l.time >= 0 && l.alg >= 0 && !l.cpuTime && size > 0 {
			timeHalf := printedHalf(f[base+l.time])
			if l.ms {
				timeHalf *= 1000
			}
			want := size / t / 1e3
			if tol := printedHalf(f[base+l.alg]) + want*timeHalf/t + algbwSlack*want; math.Abs(a-want) > tol {
				return p.errf("%s algbw %s is not size %s / time %g µs = %.4g GB/s, as nccl-tests computes it: the file was edited, or a column is not what its header says",
					side, f[base+l.alg], f[0], t, want)
			}
		}
		if s == 0 {
			r.TimeOutUS, r.AlgOutGBps, r.BusOutGBps, r.WrongOut = t, a, b, w
		} else {
			r.TimeInUS, r.AlgInGBps, r.BusInGBps, r.WrongIn = t, a, b, w
		}
	}
	t := p.cur
	if n := len(t.Rows); n > 0 && size < t.Rows[n-1].Bytes {
		// The sizes start over: a second run without a header of its own.
		lay, label := p.lay, p.label
		ranks, g, cut := p.ranks, p.rank0G, p.cutRank
		if err := p.newTest(t.Collective); err != nil {
			return err
		}
		p.lay, p.label, p.ranks, p.rank0G, p.cutRank = lay, label, ranks, g, cut
		p.cur.GPUs, p.cur.WrongColumn = t.GPUs, t.WrongColumn
		t = p.cur
	}
	if t.WrongColumn == "" {
		t.WrongColumn = l.wrongName
	}
	t.Rows = append(t.Rows, r)
	return nil
}

// algbwSlack is how far (a share of it) a row's algorithm bandwidth may be
// from its size over its time beyond the rounding of both as printed:
// nccl-tests computes the two from one measured time, and every real file
// of the corpus (internal/collective/testdata, this package's testdata) is
// within 0.6% once the rounding is allowed for.
const algbwSlack = 0.01

// printedHalf is half a unit of the last digit a number was printed with
// ("3912.9": 0.05): how far rounding may have moved it. A number in
// exponent form is not checked (+Inf).
func printedHalf(s string) float64 {
	if strings.ContainsAny(s, "eE") {
		return math.Inf(1)
	}
	if i := strings.IndexByte(s, '.'); i >= 0 {
		return 0.5 * math.Pow10(-(len(s) - i - 1))
	}
	return 0.5
}

func countRows(ts []Test) int {
	n := 0
	for _, t := range ts {
		n += len(t.Rows)
	}
	return n
}

// Factor is nccl-tests' bus bandwidth over algorithm bandwidth for a
// collective (its binary's name without _perf) on n ranks (each test's
// GetBw in nccl-tests' src/); ok is false for a collective it does not
// know.
func Factor(collective string, n int) (float64, bool) {
	if n < 1 {
		return 0, false
	}
	fn := float64(n)
	switch collective {
	case "all_reduce":
		return 2 * (fn - 1) / fn, true
	case "all_gather", "reduce_scatter", "alltoall", "gather", "scatter":
		return (fn - 1) / fn, true
	case "broadcast", "reduce", "sendrecv", "hypercube":
		return 1, true
	}
	return 0, false
}

// ranksOf is the rank count whose factor f is (nearest), 0 when none:
// the inverse of Factor for the collectives whose factor depends on n.
func ranksOf(collective string, f float64) int {
	var n float64
	switch collective {
	case "all_reduce":
		if f >= 2 {
			return 0
		}
		n = 2 / (2 - f)
	case "all_gather", "reduce_scatter", "alltoall", "gather", "scatter":
		if f >= 1 {
			return 0
		}
		n = 1 / (1 - f)
	default:
		return 1
	}
	if n > 1<<24 {
		return 0
	}
	return max(1, int(math.Round(n)))
}

// checkFactor refuses a test whose bus bandwidths are not its algorithm
// bandwidths times the collective's factor for its rank count (the rank
// lines' count, else the count the largest row implies).
func (p *parser) checkFactor(t *Test) error {
	if _, ok := Factor(t.Collective, 1); !ok {
		return nil
	}
	n := t.Ranks
	if n == 0 {
		// The row that says most: the largest algorithm bandwidth.
		var best *Row
		for i := range t.Rows {
			if r := &t.Rows[i]; best == nil || r.AlgOutGBps > best.AlgOutGBps {
				best = r
			}
		}
		if best.AlgOutGBps < 1 {
			return nil // too few digits to tell
		}
		if n = ranksOf(t.Collective, best.BusOutGBps/best.AlgOutGBps); n == 0 {
			return fmt.Errorf("%s:%d: busbw %g over algbw %g = %.4g: no rank count gives that factor for %s (%s): the file was edited, or is not of %s",
				p.file, best.Line, best.BusOutGBps, best.AlgOutGBps, best.BusOutGBps/best.AlgOutGBps, t.Collective, factorWords(t.Collective), t.Collective)
		}
	}
	factor, _ := Factor(t.Collective, n)
	src := "implied by its largest row"
	if t.Ranks > 0 {
		src = "from its \"# Using devices\" lines"
	}
	for _, r := range t.Rows {
		for _, s := range []struct {
			side     string
			alg, bus float64
		}{{"out-of-place", r.AlgOutGBps, r.BusOutGBps}, {"in-place", r.AlgInGBps, r.BusInGBps}} {
			// Printed with 2 decimals (fewer when wider than the
			// column, from 1000 GB/s): each value's rounding, and 0.1%
			// for the wide ones.
			tol := 0.005 + factor*0.005 + 1e-3*s.bus
			if math.Abs(s.bus-factor*s.alg) > tol {
				return fmt.Errorf("%s:%d: %s busbw %g is not algbw %g × %.4g, the %s factor %s for %d ranks (%s): the file was edited, or is not of %s on %d ranks",
					p.file, r.Line, s.side, s.bus, s.alg, factor, t.Collective, factorWords(t.Collective), n, src, t.Collective, n)
			}
		}
	}
	return nil
}

func factorWords(c string) string {
	switch c {
	case "all_reduce":
		return "2(n-1)/n"
	case "broadcast", "reduce", "sendrecv", "hypercube":
		return "1"
	}
	return "(n-1)/n"
}

// gpusOf reads "nThread 1 nGpus 8 ..." (GPUs per process); 0 when the
// comment is another.
func gpusOf(f []string) int {
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "nGpus" {
			if n, err := strconv.Atoi(f[i+1]); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}
