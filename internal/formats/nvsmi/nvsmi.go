// Package nvsmi reads the matrix `nvidia-smi topo -m` prints into a
// topology.Node.
//
// The output has a column header line (GPU0 GPU1 ... then NIC0.. or, on
// older drivers, the devices' own names such as mlx5_0, then CPU Affinity,
// NUMA Affinity and, on newer drivers, GPU NUMA ID), one row per GPU and one
// per NIC, then a legend and, on newer drivers, a NIC Legend naming NICk.
// Cells are separated by tabs, or by spaces where the tabs were expanded
// (a page, a terminal copy); no cell value contains a space, so the only
// names with spaces are the known header columns. Text before the header
// (a shell prompt, a note from whoever collected it) and after the matrix
// (legends, other output) is skipped.
//
// Incomplete output (a pasted excerpt, a cut log) is refused when a GPU row
// is missing or cut short, and imported with a warning when only NIC rows
// are missing: the GPU rows carry every GPU-GPU and GPU-NIC path. A line
// starting with "[..." marks where whoever collected the text cut it; the
// row just before such a mark is taken as cut unless it is complete and its
// last cell cannot be the start of a longer value.
package nvsmi

// Parse: the rows and cells of the matrix, what an incomplete output lacks,
// the checks of the matrix, and the NIC Legend. The column header is read
// in header.go.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

type row struct {
	line  int
	label string
	pos   int
	cells []string
}

// CutRow is a row of an incomplete output that is there but cut short.
type CutRow struct {
	Row    string
	Line   int
	Detail string
}

// IncompleteError is returned for an output whose GPU rows are not all
// there in full: the node cannot be known from it.
type IncompleteError struct {
	File string
	// CutLine is the line of the cut mark ("[... ...]"), 0 when unmarked.
	CutLine int
	// Cut lists the rows (GPU or NIC) that are there but cut short.
	Cut []CutRow
	// MissingGPUs and MissingNICs are the header's rows that are absent.
	MissingGPUs []string
	MissingNICs []string
}

func (e *IncompleteError) Error() string {
	var b strings.Builder
	line := e.CutLine
	if len(e.Cut) > 0 {
		line = e.Cut[0].Line
	}
	b.WriteString(e.File)
	if line > 0 {
		fmt.Fprintf(&b, ":%d", line)
	}
	b.WriteString(": incomplete output, not every GPU row is there")
	if e.CutLine > 0 {
		fmt.Fprintf(&b, " (the text is cut at line %d)", e.CutLine)
	}
	for _, c := range e.Cut {
		fmt.Fprintf(&b, "; row %s at line %d is cut: %s", c.Row, c.Line, c.Detail)
	}
	if len(e.MissingGPUs) > 0 {
		fmt.Fprintf(&b, "; missing GPU rows: %s", strings.Join(e.MissingGPUs, ", "))
	}
	if len(e.MissingNICs) > 0 {
		fmt.Fprintf(&b, "; missing NIC rows: %s", strings.Join(e.MissingNICs, ", "))
	}
	return b.String()
}

// maxErrors bounds the errors one Parse reports.
const maxErrors = 20

type parser struct {
	file    string
	errs    []error
	dropped int // errors past maxErrors
}

func (p *parser) errorf(line int, format string, args ...any) {
	if len(p.errs) == maxErrors {
		p.dropped++
		return
	}
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s", p.file, line, fmt.Sprintf(format, args...)))
}

func (p *parser) err() error {
	if p.dropped > 0 {
		return errors.Join(append(p.errs, fmt.Errorf("%s: and %d more errors", p.file, p.dropped))...)
	}
	return errors.Join(p.errs...)
}

// Parse reads the output of `nvidia-smi topo -m` from data; file names it
// in errors and becomes the node's Source. The node's GPUs are in column
// order (Index n for GPUn), its NICs in column order, named by the NIC
// Legend or by their column labels. The output names no NVLink
// generation; topology.Infer works it out where the counts show it.
func Parse(file string, data []byte) (*topology.Node, error) {
	p := &parser{file: file}
	text := string(data)
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("%s: empty input: expected the output of nvidia-smi topo -m", file)
	}
	lines := strings.Split(text, "\n")

	// The header: the first line whose first field is GPU0.
	var h *header
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "GPU0" {
			var err error
			if h, err = p.header(i+1, f); err != nil {
				return nil, err
			}
			break
		}
	}
	if h == nil {
		return nil, fmt.Errorf("%s: no column header: expected a line of column names starting with GPU0 (the output of nvidia-smi topo -m)", file)
	}

	// The rows: from the line after the header to a blank line, a cut mark,
	// the legend or the end of the text.
	var rows []row
	seen := map[string]int{}
	cutLine, end := 0, len(lines)
	for i := h.line; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if t == "" || strings.HasPrefix(t, "Legend") || strings.HasPrefix(t, "NIC Legend") {
			end = i
			break
		}
		if isCutMark(t) {
			cutLine, end = i+1, i+1
			break
		}
		f := strings.Fields(t)
		pos, ok := h.pos[f[0]]
		if !ok {
			p.errorf(i+1, "expected a row of the matrix (%s) or a blank line, got %q", h.rowNames(), clip(t))
			continue
		}
		if prev, dup := seen[f[0]]; dup {
			p.errorf(i+1, "row %s again (first at line %d)", f[0], prev)
			continue
		}
		seen[f[0]] = i + 1
		rows = append(rows, row{line: i + 1, label: f[0], pos: pos, cells: f[1:]})
	}
	// The last row is cut when the cut mark follows it, or when it is short
	// and nothing but blank lines follows.
	lastCut := false
	if len(rows) > 0 {
		last := rows[len(rows)-1]
		switch {
		case cutLine > 0:
			lastCut = last.line == cutLine-1
		case len(last.cells) < h.cells(h.isGPU(last.pos)):
			lastCut = strings.TrimSpace(strings.Join(lines[last.line:], "")) == ""
		}
	}
	legend := p.nicLegend(lines, end)

	// The cells.
	n := len(h.gpus) + len(h.nics)
	matrix := make([][]topology.Link, n)
	rowLine := make([]int, n) // 0: no row
	numa := make([]int, n)
	cpus := make([]string, n)
	inc := &IncompleteError{File: file, CutLine: cutLine}
	for ri, r := range rows {
		gpuRow := h.isGPU(r.pos)
		want := h.cells(gpuRow)
		got := len(r.cells)
		nicWithExtra := !gpuRow && len(h.extra) > 0 && got == h.matrixCols()+len(h.extra)
		if nicWithExtra {
			want = got
		}
		if ri == len(rows)-1 && lastCut {
			switch {
			case got < want:
				inc.Cut = append(inc.Cut, CutRow{r.label, r.line,
					fmt.Sprintf("%d of %d cells (%s)", got, want, h.describe(gpuRow))})
				continue
			case got == want && mayBeCut(r.cells[got-1]):
				inc.Cut = append(inc.Cut, CutRow{r.label, r.line,
					fmt.Sprintf("its last cell %q may be the start of a longer value", r.cells[got-1])})
				continue
			}
		}
		rowLine[r.pos] = r.line
		if got != want {
			p.errorf(r.line, "row %s: expected %d cells (%s), got %d", r.label, want, h.describe(gpuRow), got)
			continue
		}
		links := make([]topology.Link, h.matrixCols())
		ok := true
		for j := range links {
			l, err := topology.ParseLink(r.cells[j])
			if err != nil {
				p.errorf(r.line, "row %s, column %s: %v", r.label, h.label(j), err)
				ok = false
				continue
			}
			links[j] = l
		}
		numa[r.pos] = -1
		for k, kind := range h.extra {
			if !gpuRow && !nicWithExtra {
				break
			}
			v := r.cells[h.matrixCols()+k]
			switch kind {
			case colCPUAffinity:
				switch {
				case v == "N/A":
				case isList(v):
					cpus[r.pos] = v
				default:
					p.errorf(r.line, "row %s: CPU Affinity %q: expected a CPU list such as 0-15,32-47, or N/A", r.label, v)
					ok = false
				}
			case colNUMAAffinity, colGPUNUMAID:
				id, err := strconv.Atoi(v)
				switch {
				case v == "N/A" || (kind == colNUMAAffinity && isList(v) && err != nil):
					// unknown, or several NUMA nodes: no single one.
				case err == nil && id >= 0 && isList(v):
					if kind == colNUMAAffinity {
						numa[r.pos] = id
					}
				default:
					p.errorf(r.line, "row %s: %s %q: expected a NUMA node number, a list of them, or N/A", r.label, kind, v)
					ok = false
				}
			}
		}
		if ok {
			matrix[r.pos] = links
		}
	}

	// What is missing.
	cut := map[string]bool{}
	for _, c := range inc.Cut {
		cut[c.Row] = true
	}
	gpuCut := false
	for pos := range n {
		lab := h.label(pos)
		if cut[lab] {
			gpuCut = gpuCut || h.isGPU(pos)
			continue
		}
		if rowLine[pos] > 0 {
			continue
		}
		if h.isGPU(pos) {
			inc.MissingGPUs = append(inc.MissingGPUs, lab)
		} else {
			inc.MissingNICs = append(inc.MissingNICs, lab)
		}
	}
	incomplete := gpuCut || len(inc.MissingGPUs) > 0
	if err := p.err(); err != nil {
		if incomplete {
			return nil, errors.Join(inc, err)
		}
		return nil, err
	}
	if incomplete {
		return nil, inc
	}

	// The matrix: X on the diagonal only, no NVLink to a NIC, symmetric.
	for a := range n {
		if matrix[a] == nil {
			continue
		}
		for b := range n {
			l := matrix[a][b]
			switch {
			case a == b && l.Class != topology.Self:
				p.errorf(rowLine[a], "%s-%s is %s: expected X on the diagonal", h.label(a), h.label(b), l)
			case a != b && l.Class == topology.Self:
				p.errorf(rowLine[a], "%s-%s is X off the diagonal", h.label(a), h.label(b))
			case l.Class.NVLink() && (!h.isGPU(a) || !h.isGPU(b)):
				p.errorf(rowLine[a], "%s-%s is %s: NVLink does not reach a NIC", h.label(a), h.label(b), l)
			case b > a && matrix[b] != nil && matrix[b][a] != l:
				p.errorf(rowLine[a], "%s-%s is %s but %s-%s is %s (line %d)",
					h.label(a), h.label(b), l, h.label(b), h.label(a), matrix[b][a], rowLine[b])
			}
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}

	node := &topology.Node{Source: file}
	g := len(h.gpus)
	for i := range g {
		node.GPUs = append(node.GPUs, topology.GPU{Index: i, NUMA: numa[i], CPUAffinity: cpus[i]})
		node.GPUPaths = append(node.GPUPaths, matrix[i][:g:g])
	}
	var unnamed []string
	for k, lab := range h.nics {
		name, ok := legend[lab]
		if !ok {
			name = lab
			if isNICk(lab) {
				unnamed = append(unnamed, lab)
			}
		}
		nic := topology.NIC{Index: k, Name: name, NUMA: -1}
		if matrix[g+k] != nil {
			nic.NUMA = numa[g+k]
		}
		node.NICs = append(node.NICs, nic)
	}
	if len(h.nics) > 0 {
		for i := range g {
			node.NICPaths = append(node.NICPaths, matrix[i][g:n:n])
		}
	}
	if len(inc.Cut) > 0 || len(inc.MissingNICs) > 0 {
		var b strings.Builder
		b.WriteString("incomplete output")
		if cutLine > 0 {
			fmt.Fprintf(&b, " (cut at line %d)", cutLine)
		}
		b.WriteString(": NIC rows missing: ")
		var names []string
		for _, c := range inc.Cut {
			names = append(names, fmt.Sprintf("%s (cut at line %d)", c.Row, c.Line))
		}
		names = append(names, inc.MissingNICs...)
		b.WriteString(strings.Join(names, ", "))
		b.WriteString("; their GPU paths come from the GPU rows, their paths to other NICs are unknown")
		node.Warnings = append(node.Warnings, b.String())
	}
	if len(unnamed) > 0 {
		node.Warnings = append(node.Warnings, fmt.Sprintf(
			"no NIC Legend names %s: named by their column labels", strings.Join(unnamed, ", ")))
	}
	for _, lab := range sortedKeys(legend) {
		if _, ok := h.pos[lab]; !ok {
			node.Warnings = append(node.Warnings, fmt.Sprintf("NIC Legend names %s, which is not a column", lab))
		}
	}
	// A -p2p matrix printed with the topology (the same session's
	// output) says which pairs NCCL cannot join by P2P.
	p2p, err := ParseP2P(file, data)
	if err != nil {
		return nil, err
	}
	if p2p != nil {
		if len(p2p) != g {
			return nil, fmt.Errorf("%s: p2p matrix has %d GPUs, the topology %d", file, len(p2p), g)
		}
		node.P2P = p2p
	}
	if err := node.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	topology.Infer(node)
	return node, nil
}

// nicLegend reads the "NIC Legend:" section after the matrix (NIC0: mlx5_0).
func (p *parser) nicLegend(lines []string, from int) map[string]string {
	legend := map[string]string{}
	at := map[string]int{}
	in := false
	for i := from; i < len(lines); i++ {
		t := strings.TrimSpace(lines[i])
		if t == "NIC Legend:" {
			in = true
			continue
		}
		if !in || t == "" {
			continue
		}
		lab, name, ok := strings.Cut(t, ":")
		name = strings.TrimSpace(name)
		if !ok || !isNICk(lab) || name == "" || strings.ContainsAny(name, " \t") {
			in = false
			continue
		}
		if prev, dup := at[lab]; dup && legend[lab] != name {
			p.errorf(i+1, "NIC Legend names %s %s, but line %d names it %s", lab, name, prev, legend[lab])
			continue
		}
		legend[lab], at[lab] = name, i+1
	}
	return legend
}

// isCutMark reports a line that marks where the text was cut: "[... ...]".
func isCutMark(t string) bool {
	return strings.HasPrefix(t, "[...") || strings.HasPrefix(t, "[…")
}

// mayBeCut reports whether a cell could be the start of a longer value:
// everything but the fixed words (NV1 may have been NV18, 0-15 0-15,32-47).
func mayBeCut(cell string) bool {
	switch strings.ToUpper(cell) {
	case "X", "NVB", "PIX", "PXB", "PHB", "NODE", "SYS", "SOC", "NET", "N/A":
		return false
	}
	return true
}

// isList reports a list of numbers and ranges: 0-15,32-47.
func isList(s string) bool {
	if s == "" {
		return false
	}
	for item := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(item, "-")
		if !isNumber(lo) || isRange && !isNumber(hi) {
			return false
		}
		if isRange {
			a, errA := strconv.Atoi(lo)
			b, errB := strconv.Atoi(hi)
			if errA != nil || errB != nil || a > b {
				return false
			}
		}
	}
	return true
}

func isNumber(s string) bool { return s != "" && strings.Trim(s, "0123456789") == "" }

func clip(s string) string {
	if r := []rune(s); len(r) > 40 {
		return string(r[:40]) + "..."
	}
	return s
}

func sortedKeys(m map[string]string) []string {
	keys := slices.Collect(maps.Keys(m))
	// Legend labels are NICk: by number.
	num := func(s string) int { v, _ := strconv.Atoi(strings.TrimPrefix(s, "NIC")); return v }
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(num(a), num(b)), strings.Compare(a, b)) })
	return keys
}
