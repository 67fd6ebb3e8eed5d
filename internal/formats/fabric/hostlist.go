package fabric

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxHostlistNames bounds what one hostlist expression, and one file, may
// expand to. A real fabric has far fewer nodes; the bound keeps a typo such
// as node[1-1000000000] from exhausting memory.
const MaxHostlistNames = 1 << 20

// maxHostlistNameLen bounds one expanded name: host names are at most 253
// characters, Slurm's switch names 64.
const maxHostlistNameLen = 255

// ExpandHostlist expands a Slurm hostlist expression into the names it
// stands for, in order, duplicates kept:
//
//	circe-n[001-003]       circe-n001 circe-n002 circe-n003
//	node[1-3,7]            node1 node2 node3 node7
//	a,b[8-10]              a b8 b9 b10
//	rack[1-2]-n[01-02]     rack1-n01 rack1-n02 rack2-n01 rack2-n02
//
// Entries are separated by commas or white space outside brackets. A bracket
// holds comma-separated numbers and ranges lo-hi (lo <= hi); numbers are
// zero-padded to the width of lo as written, as Slurm does. Several bracket
// groups in one entry expand to every combination, the leftmost varying
// slowest. An expression naming nothing, an unbalanced or nested bracket, an
// empty or non-numeric range, a reversed range, a name longer than 255
// characters, or more than MaxHostlistNames names in all is an error.
func ExpandHostlist(expr string) ([]string, error) {
	return expandHostlist(expr, MaxHostlistNames)
}

// tooManyError is an expansion past its limit.
type tooManyError struct {
	what  string
	limit uint64
}

func (e *tooManyError) Error() string {
	return fmt.Sprintf("%s expands to more than %d names", e.what, e.limit)
}

// hostRange is lo-hi of a bracket, printed zero-padded to width.
type hostRange struct {
	lo, hi uint64
	width  int
}

// hostPart is a literal run or, when ranges is set, a bracket group.
type hostPart struct {
	lit    string
	ranges []hostRange
	count  uint64 // names the bracket stands for
	digits int    // widest number the bracket prints
}

// expandHostlist expands expr into at most limit names.
func expandHostlist(expr string, limit int) ([]string, error) {
	entries, err := splitHostlist(expr)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, errors.New("names nothing")
	}
	parsed := make([][]hostPart, len(entries))
	total := uint64(0)
	for i, e := range entries {
		parts, n, err := parseHostEntry(e, uint64(limit))
		if err != nil {
			return nil, err
		}
		total += n
		if total > uint64(limit) {
			return nil, &tooManyError{"the expression", uint64(limit)}
		}
		parsed[i] = parts
	}
	out := make([]string, 0, total)
	for _, parts := range parsed {
		out = appendHostEntry(out, parts)
	}
	return out, nil
}

// splitHostlist cuts expr at commas and white space outside brackets.
func splitHostlist(expr string) ([]string, error) {
	var entries []string
	start, open := 0, -1
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '[':
			if open >= 0 {
				return nil, fmt.Errorf("nested '[' at offset %d", i)
			}
			open = i
		case c == ']':
			if open < 0 {
				return nil, fmt.Errorf("']' without '[' at offset %d", i)
			}
			open = -1
		case open < 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			if i > start {
				entries = append(entries, expr[start:i])
			}
			start = i + 1
		}
	}
	if open >= 0 {
		return nil, fmt.Errorf("'[' at offset %d is not closed", open)
	}
	if start < len(expr) {
		entries = append(entries, expr[start:])
	}
	return entries, nil
}

// parseHostEntry splits one entry into literal runs and bracket groups and
// counts the names it stands for, refusing more than limit.
func parseHostEntry(e string, limit uint64) ([]hostPart, uint64, error) {
	var parts []hostPart
	count, length := uint64(1), 0
	for len(e) > 0 {
		open := strings.IndexByte(e, '[')
		if open < 0 {
			parts = append(parts, hostPart{lit: e})
			length += len(e)
			break
		}
		if open > 0 {
			parts = append(parts, hostPart{lit: e[:open]})
			length += open
		}
		end := strings.IndexByte(e[open:], ']') + open // splitHostlist saw it balanced
		p, err := parseHostBracket(e[open+1:end], limit)
		if err != nil {
			return nil, 0, err
		}
		parts = append(parts, p)
		length += p.digits
		count *= p.count // both at most limit (2^20): no overflow
		if count > limit {
			return nil, 0, &tooManyError{"the expression", limit}
		}
		e = e[end+1:]
	}
	if length > maxHostlistNameLen {
		return nil, 0, fmt.Errorf("names longer than %d characters", maxHostlistNameLen)
	}
	return parts, count, nil
}

// parseHostBracket reads the inside of a bracket: numbers and ranges.
func parseHostBracket(s string, limit uint64) (hostPart, error) {
	p := hostPart{}
	for r := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		if lo == "" || hi == "" {
			return p, fmt.Errorf("expected a number or a range lo-hi in [%s], got %q", s, r)
		}
		l, err := parseHostNumber(lo)
		if err != nil {
			return p, err
		}
		h, err := parseHostNumber(hi)
		if err != nil {
			return p, err
		}
		if l > h {
			return p, fmt.Errorf("range %s is reversed", r)
		}
		if h-l >= limit {
			return p, &tooManyError{"range " + r, limit}
		}
		p.count += h - l + 1
		if p.count > limit {
			return p, &tooManyError{"[" + s + "]", limit}
		}
		p.ranges = append(p.ranges, hostRange{lo: l, hi: h, width: len(lo)})
		p.digits = max(p.digits, len(lo), len(hi))
	}
	return p, nil
}

func parseHostNumber(s string) (uint64, error) {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("expected digits in a range, got %q", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("number %s is too large", s)
	}
	return n, nil
}

// appendHostEntry appends every combination of parts to out.
func appendHostEntry(out []string, parts []hostPart) []string {
	var walk func(prefix []byte, rest []hostPart)
	walk = func(prefix []byte, rest []hostPart) {
		for len(rest) > 0 && rest[0].ranges == nil {
			prefix = append(prefix, rest[0].lit...)
			rest = rest[1:]
		}
		if len(rest) == 0 {
			out = append(out, string(prefix))
			return
		}
		for _, r := range rest[0].ranges {
			for n := r.lo; ; n++ {
				walk(appendPadded(prefix, n, r.width), rest[1:])
				if n == r.hi {
					break
				}
			}
		}
	}
	walk(make([]byte, 0, 64), parts)
	return out
}

// appendPadded appends n in decimal, zero-padded to width.
func appendPadded(b []byte, n uint64, width int) []byte {
	var digits [20]byte
	d := strconv.AppendUint(digits[:0], n, 10)
	for i := len(d); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, d...)
}

// maxCompressDigits bounds the trailing digits CompressHostlist reads as a
// number; longer runs stay literal.
const maxCompressDigits = 18

// CompressHostlist writes names as a Slurm hostlist expression that
// ExpandHostlist (and Slurm) expands back into the same names in the same
// order: a run of names that differ only in their trailing number, each
// one more than the last, becomes a range, and neighbouring names with
// the same text before the number share one bracket:
//
//	n1 n2 n3 n7            n[1-3,7]
//	n08 n09 n10            n[08-10]
//	a b8 b9 b10            a,b[8-10]
//
// A range keeps the zero padding of its first number, as ExpandHostlist
// reads it, so n9 n010 stay two entries. Names must be non-empty and hold
// no '[', ']', ',' or white space (host and switch names never do); the
// result for others is not meaningful.
func CompressHostlist(names []string) string {
	type run struct {
		lo, hi uint64
		loText string
	}
	var b strings.Builder
	var prefix string
	var runs []run
	flush := func() {
		if len(runs) == 0 {
			return
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(prefix)
		if len(runs) == 1 && runs[0].lo == runs[0].hi {
			b.WriteString(runs[0].loText)
			runs = runs[:0]
			return
		}
		b.WriteByte('[')
		for i, r := range runs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(r.loText)
			if r.hi != r.lo {
				b.WriteByte('-')
				b.Write(appendPadded(nil, r.hi, len(r.loText)))
			}
		}
		b.WriteByte(']')
		runs = runs[:0]
	}
	for _, name := range names {
		cut := len(name)
		for cut > 0 && name[cut-1] >= '0' && name[cut-1] <= '9' {
			cut--
		}
		digits := name[cut:]
		if digits == "" || len(digits) > maxCompressDigits {
			flush()
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(name)
			continue
		}
		n, _ := strconv.ParseUint(digits, 10, 64) // at most 18 digits: no error
		if len(runs) > 0 && name[:cut] == prefix {
			last := &runs[len(runs)-1]
			if n == last.hi+1 && string(appendPadded(nil, n, len(last.loText))) == digits {
				last.hi = n
				continue
			}
		} else {
			flush()
			prefix = name[:cut]
		}
		runs = append(runs, run{lo: n, hi: n, loText: digits})
	}
	flush()
	return b.String()
}
