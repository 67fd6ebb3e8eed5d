package nvsmi

// The column header: the columns after the matrix (CPU Affinity, NUMA
// Affinity, GPU NUMA ID), the GPU and NIC labels and their positions, and
// how the header line is read.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/topology"
)

type colKind int

const (
	colCPUAffinity colKind = iota
	colNUMAAffinity
	colGPUNUMAID
)

// extraColumns are the header columns after the matrix, as printed.
var extraColumns = []struct {
	words []string
	kind  colKind
}{
	{[]string{"CPU", "Affinity"}, colCPUAffinity},
	{[]string{"NUMA", "Affinity"}, colNUMAAffinity},
	{[]string{"GPU", "NUMA", "ID"}, colGPUNUMAID},
}

func (k colKind) String() string { return strings.Join(extraColumns[k].words, " ") }

// header is the column header line.
type header struct {
	line  int
	gpus  []string // GPU0, GPU1, ...
	nics  []string // NIC0.. or mlx5_0..
	extra []colKind
	pos   map[string]int // label -> matrix position (GPUs, then NICs)
}

func (h *header) label(pos int) string {
	if pos < len(h.gpus) {
		return h.gpus[pos]
	}
	return h.nics[pos-len(h.gpus)]
}

func (h *header) isGPU(pos int) bool { return pos < len(h.gpus) }

func (h *header) matrixCols() int { return len(h.gpus) + len(h.nics) }

// cells is the number of cells a row should have: the matrix, and for GPU
// rows the extra columns.
func (h *header) cells(gpuRow bool) int {
	if gpuRow {
		return h.matrixCols() + len(h.extra)
	}
	return h.matrixCols()
}

// describe says what the cells of a row are, for error messages.
func (h *header) describe(gpuRow bool) string {
	parts := []string{plural(len(h.gpus), "GPU column")}
	if len(h.nics) > 0 {
		parts = append(parts, plural(len(h.nics), "NIC column"))
	}
	if gpuRow {
		for _, k := range h.extra {
			parts = append(parts, k.String())
		}
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

func plural(n int, s string) string {
	if n == 1 {
		return "1 " + s
	}
	return strconv.Itoa(n) + " " + s + "s"
}

// header reads the column header line.
func (p *parser) header(line int, f []string) (*header, error) {
	h := &header{line: line, pos: map[string]int{}}
	if len(f) > 1 {
		if _, err := topology.ParseLink(f[1]); err == nil {
			return nil, fmt.Errorf("%s:%d: expected the column header (GPU0 GPU1 ... CPU Affinity) but found the GPU0 row: the header line is missing", p.file, line)
		}
	}
	seenExtra := map[colKind]bool{}
	for i := 0; i < len(f); {
		if k, ok := matchExtra(f[i:]); ok {
			if seenExtra[k] {
				p.errorf(line, "column %s twice", k)
			}
			seenExtra[k] = true
			h.extra = append(h.extra, k)
			i += len(extraColumns[k].words)
			continue
		}
		tok := f[i]
		i++
		switch {
		case len(h.extra) > 0:
			p.errorf(line, "column %q after %s: expected CPU Affinity, NUMA Affinity or GPU NUMA ID", tok, h.extra[len(h.extra)-1])
		case isGPUk(tok):
			want := "GPU" + strconv.Itoa(len(h.gpus))
			switch {
			case len(h.nics) > 0:
				p.errorf(line, "column %s after the NIC columns", tok)
			case tok != want:
				p.errorf(line, "column %s: expected %s", tok, want)
			default:
				h.pos[tok] = len(h.gpus)
				h.gpus = append(h.gpus, tok)
			}
		default:
			if _, err := topology.ParseLink(tok); err == nil {
				p.errorf(line, "column %q is a matrix value, not a device", tok)
				continue
			}
			if _, dup := h.pos[tok]; dup {
				p.errorf(line, "column %s twice", tok)
				continue
			}
			h.pos[tok] = -1 // set below, once the GPUs are counted
			h.nics = append(h.nics, tok)
		}
	}
	for k, lab := range h.nics {
		h.pos[lab] = len(h.gpus) + k
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return h, nil
}

// rowNames lists the row labels for messages: GPU0..GPU7, NIC0..NIC9.
func (h *header) rowNames() string {
	s := span(h.gpus)
	if len(h.nics) > 0 {
		s += ", " + span(h.nics)
	}
	return s
}

func span(labels []string) string {
	if len(labels) == 1 {
		return labels[0]
	}
	return labels[0] + ".." + labels[len(labels)-1]
}

func matchExtra(f []string) (colKind, bool) {
	for i, c := range extraColumns {
		if len(f) < len(c.words) {
			continue
		}
		ok := true
		for j, w := range c.words {
			if f[j] != w {
				ok = false
				break
			}
		}
		if ok {
			return colKind(i), true
		}
	}
	return 0, false
}

func isGPUk(s string) bool { return hasNumber(s, "GPU") }
func isNICk(s string) bool { return hasNumber(s, "NIC") }

func hasNumber(s, prefix string) bool {
	rest, ok := strings.CutPrefix(s, prefix)
	return ok && rest != "" && strings.Trim(rest, "0123456789") == ""
}
