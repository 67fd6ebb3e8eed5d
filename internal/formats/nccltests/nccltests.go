// Package nccltests reads the text output of NVIDIA's nccl-tests
// (all_reduce_perf, all_gather_perf, reduce_scatter_perf, sendrecv_perf):
// one row per message size, with the out-of-place and in-place time,
// algorithm and bus bandwidth. Calibration (internal/collective) fits the
// cost model to what a cluster measured with them.
//
// A row reads
//
//	[0:]  size  count  type  redop  root  time algbw busbw #wrong  time algbw busbw #wrong
//
// (the "0:" rank prefix of an MPI launch is dropped); comment lines start
// with "#". A file that is cut off (a row with fewer fields), numbers that
// cannot be (a negative or zero time, a bus bandwidth that is negative or
// not a number, sizes that do not grow), or no row at all are refused with
// the file, the line and the reason.
package nccltests

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Row is one measured message size.
type Row struct {
	Line  int
	Bytes float64
	Type  string
	// Out-of-place and in-place time (µs) and bus bandwidth (GB/s).
	TimeOutUS, BusOutGBps float64
	TimeInUS, BusInGBps   float64
}

// BusBW is the better of the row's two bus bandwidths, as nccl-tests'
// summary reads them.
func (r Row) BusBW() float64 { return max(r.BusOutGBps, r.BusInGBps) }

// Result is one file's rows, in file order.
type Result struct {
	File string
	// GPUs is the nGpus of the header (GPUs per process), 0 when it has none.
	GPUs int
	Rows []Row
}

// maxRows bounds one file.
const maxRows = 1 << 16

// Parse reads nccl-tests output; file names it in errors.
func Parse(file string, data []byte) (Result, error) {
	res := Result{File: file}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	errf := func(format string, args ...any) error {
		return fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...))
	}
	for sc.Scan() {
		line++
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasSuffix(f[0], ":") {
			if _, err := strconv.Atoi(strings.TrimSuffix(f[0], ":")); err == nil {
				f = f[1:] // an MPI rank's prefix
			}
		}
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "#") {
			res.GPUs = max(res.GPUs, gpusOf(f))
			continue
		}
		size, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue // prose around the table
		}
		if len(f) < 13 {
			return res, errf("a row of %d fields, expected 13 (size count type redop root, then time algbw busbw #wrong out of place and in place): the file is cut off here", len(f))
		}
		if len(res.Rows) == maxRows {
			return res, errf("more than %d rows", maxRows)
		}
		num := func(i int, what string) (float64, error) {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return 0, errf("field %d (%s) = %q: expected a number", i+1, what, f[i])
			}
			return v, nil
		}
		r := Row{Line: line, Bytes: size, Type: f[2]}
		var errs []error
		var e error
		r.TimeOutUS, e = num(5, "out-of-place time")
		errs = append(errs, e)
		r.BusOutGBps, e = num(7, "out-of-place busbw")
		errs = append(errs, e)
		r.TimeInUS, e = num(9, "in-place time")
		errs = append(errs, e)
		r.BusInGBps, e = num(11, "in-place busbw")
		errs = append(errs, e)
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		switch {
		case size <= 0:
			return res, errf("size %s: expected a positive byte count", f[0])
		case r.TimeOutUS <= 0 || r.TimeInUS <= 0:
			return res, errf("time %g / %g µs: a measured time is positive", r.TimeOutUS, r.TimeInUS)
		case r.BusOutGBps < 0 || r.BusInGBps < 0:
			return res, errf("busbw %g / %g GB/s: a bandwidth is not negative", r.BusOutGBps, r.BusInGBps)
		case len(res.Rows) > 0 && size <= res.Rows[len(res.Rows)-1].Bytes:
			return res, errf("size %s after %g: sizes grow from row to row", f[0], res.Rows[len(res.Rows)-1].Bytes)
		}
		res.Rows = append(res.Rows, r)
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("%s: %w", file, err)
	}
	if len(res.Rows) == 0 {
		return res, fmt.Errorf("%s: no rows: expected the output of an nccl-tests binary (size count type redop root time algbw busbw ...)", file)
	}
	return res, nil
}

// gpusOf reads "# nThread 1 nGpus 8 ..." (GPUs per process); 0 when the
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
