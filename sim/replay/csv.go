package replay

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// maxErrors bounds the problems one reader reports before it stops.
const maxErrors = 20

// table reads a CSV file by column name, so that columns may come in any
// order and extra ones are ignored. Errors name file:line and the column.
type table struct {
	file string
	r    *csv.Reader
	cols map[string]int
	rec  []string
	line int
	errs []error
}

// openTable reads the header and checks that every required column is
// there.
func openTable(file string, rd io.Reader, required ...string) (*table, error) {
	r := csv.NewReader(rd)
	r.FieldsPerRecord = -1 // checked per record, to name the line
	r.TrimLeadingSpace = true
	r.ReuseRecord = true
	head, err := r.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s:1: header: the file is empty; expected columns %s", file, strings.Join(required, ","))
		}
		return nil, csvError(file, err)
	}
	t := &table{file: file, r: r, cols: map[string]int{}}
	for i, h := range head {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		t.cols[strings.ToLower(h)] = i
	}
	var missing []string
	for _, c := range required {
		if _, ok := t.cols[c]; !ok {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s:1: header: missing column %s (have %s)", file, strings.Join(missing, ", "), strings.Join(head, ","))
	}
	return t, nil
}

func csvError(file string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s:%d: %w", file, pe.Line, pe.Err)
	}
	return fmt.Errorf("%s: %w", file, err)
}

// next moves to the next record; false at the end or after too many
// errors. Blank lines are skipped.
func (t *table) next() bool {
	for {
		if len(t.errs) >= maxErrors {
			return false
		}
		rec, err := t.r.Read()
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.errs = append(t.errs, csvError(t.file, err))
			return false
		}
		t.line, _ = t.r.FieldPos(0)
		if len(rec) == 1 && strings.TrimSpace(rec[0]) == "" {
			continue
		}
		t.rec = rec
		return true
	}
}

// has reports whether the file has the column.
func (t *table) has(col string) bool { _, ok := t.cols[col]; return ok }

// str is the column's value in the current record ("" when the record is
// short or the column absent).
func (t *table) str(col string) string {
	i, ok := t.cols[col]
	if !ok || i >= len(t.rec) {
		return ""
	}
	return strings.TrimSpace(t.rec[i])
}

func (t *table) bad(col, format string, args ...any) {
	t.errs = append(t.errs, fmt.Errorf("%s:%d: %s: %s", t.file, t.line, col, fmt.Sprintf(format, args...)))
}

// int reads a whole number in [lo, hi]; ok is false (and the error noted)
// when it is missing or out of range.
func (t *table) int(col string, lo, hi int64) (int64, bool) {
	s := t.str(col)
	if s == "" {
		t.bad(col, "expected a whole number, got nothing")
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Some exports write whole numbers as 12.0.
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			t.bad(col, "expected a whole number, got %q", s)
			return 0, false
		}
		v = int64(f)
	}
	if v < lo || v > hi {
		t.bad(col, "expected %d to %d, got %d", lo, hi, v)
		return 0, false
	}
	return v, true
}

// float reads a finite number in [lo, hi].
func (t *table) float(col string, lo, hi float64) (float64, bool) {
	s := t.str(col)
	if s == "" {
		t.bad(col, "expected a number, got nothing")
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !finite(v) {
		t.bad(col, "expected a number, got %q", s)
		return 0, false
	}
	if v < lo || v > hi {
		t.bad(col, "expected %g to %g, got %g", lo, hi, v)
		return 0, false
	}
	return v, true
}

// datetime reads "2006-01-02 15:04:05" (UTC) as seconds since the epoch.
func (t *table) datetime(col string) (float64, bool) {
	s := t.str(col)
	ts, err := time.Parse(time.DateTime, s)
	if err != nil {
		t.bad(col, "expected a time like 2017-10-09 07:01:55, got %q", s)
		return 0, false
	}
	return float64(ts.Unix()), true
}

// err joins the problems found.
func (t *table) err() error {
	if len(t.errs) >= maxErrors {
		t.errs = append(t.errs, fmt.Errorf("%s: stopped after %d problems", t.file, maxErrors))
	}
	return errors.Join(t.errs...)
}

// maxSeconds bounds times and durations: a century.
const maxSeconds = 100 * 365 * 24 * 3600
