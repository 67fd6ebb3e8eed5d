package replay

import (
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
)

// Trace kinds.
const (
	KindAlibaba   = "alibaba-openb"
	KindITP       = "itp"
	KindPhilly    = "philly"
	KindHelios    = "helios"
	KindSynthetic = "synthetic"
)

// Skip reasons of job-log records (Trace.Skipped): records that are
// well-formed but cannot be replayed are counted by reason and left out,
// never dropped unsaid; a malformed value is an error naming file:line.
const (
	SkipNoGPU            = "no GPU (num_gpu 0): toposched places GPUs only"
	SkipNoDuration       = "duration missing"
	SkipNegativeDuration = "negative duration"
	// SkipOutOfOrder: ITP and Helios list jobs in submission order, so a
	// record submitted before the one above it is out of order. (Philly's
	// processed log is grouped, not in time order: it is sorted instead.)
	SkipOutOfOrder = "submitted before the record above it (the log is in submission order)"
)

// maxJobGPUs bounds a job's GPUs in a log.
const maxJobGPUs = 1 << 20

// duration reads a job's run time: "" when usable, else the skip reason
// (missing or negative); ok is false when the value is malformed (the
// error is noted) or skipped.
func (t *table) duration(col string) (v float64, skip string, ok bool) {
	raw := t.str(col)
	if raw == "" {
		return 0, SkipNoDuration, false
	}
	if f, err := strconv.ParseFloat(raw, 64); err == nil && finite(f) && f < 0 {
		return 0, SkipNegativeDuration, false
	}
	v, ok = t.float(col, 0, maxSeconds)
	return v, "", ok
}

// ReadITP reads a Microsoft ITP job log (microsoft/elasticflow-traces
// cluster*.csv: job_id, submission_time, duration, num_gpu; times in
// seconds).
func ReadITP(file string, r io.Reader) (*Trace, error) {
	t, err := openTable(file, r, "job_id", "submission_time", "duration", "num_gpu")
	if err != nil {
		return nil, err
	}
	tr := &Trace{Kind: KindITP, Source: file}
	seen := map[string]int{}
	last := math.Inf(-1)
	for t.next() {
		tr.Records++
		id := t.str("job_id")
		if !jobIDPattern.MatchString(id) {
			t.bad("job_id", "expected letters, digits, '.', '_', ':' or '-' (up to 128), got %q", id)
			continue
		}
		if l, dup := seen[id]; dup {
			t.bad("job_id", "job %q already listed on line %d", id, l)
			continue
		}
		seen[id] = t.line
		at, ok1 := t.float("submission_time", 0, maxSeconds)
		dur, skip, ok2 := t.duration("duration")
		gpus, ok3 := t.int("num_gpu", 0, maxJobGPUs)
		if !ok1 || !ok3 || (!ok2 && skip == "") {
			continue
		}
		switch {
		case skip != "":
		case gpus == 0:
			skip = SkipNoGPU
		case at < last:
			skip = SkipOutOfOrder
		}
		if skip != "" {
			tr.skip(skip)
			continue
		}
		last = at
		tr.Jobs = append(tr.Jobs, Job{ID: id, Arrival: at, Duration: dur, GPUs: int(gpus), Line: t.line})
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	tr.sortByArrival()
	return tr, nil
}

// ReadPhilly reads the Microsoft Philly job log as the Pollux simulator
// processed it (philly.csv: timestamp "2017-10-09 07:01:55", duration
// seconds, num_gpus, gpu_time, cluster). Records have no id: a job is
// named philly-<line>. The virtual cluster goes into the label
// trace.vc.
func ReadPhilly(file string, r io.Reader) (*Trace, error) {
	t, err := openTable(file, r, "timestamp", "duration", "num_gpus")
	if err != nil {
		return nil, err
	}
	tr := &Trace{Kind: KindPhilly, Source: file}
	for t.next() {
		tr.Records++
		at, ok1 := t.datetime("timestamp")
		dur, skip, ok2 := t.duration("duration")
		gpus, ok3 := t.int("num_gpus", 0, maxJobGPUs)
		if !ok1 || !ok3 || (!ok2 && skip == "") {
			continue
		}
		if skip == "" && gpus == 0 {
			skip = SkipNoGPU
		}
		if skip != "" {
			tr.skip(skip)
			continue
		}
		j := Job{ID: "philly-" + strconv.Itoa(t.line), Arrival: at, Duration: dur, GPUs: int(gpus), Line: t.line}
		if vc := t.str("cluster"); vc != "" {
			j.Labels = map[string]string{"trace.vc": cleanLabel(vc)}
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	tr.sortByArrival()
	return tr, nil
}

// ReadHelios reads the SenseTime Helios training job log
// (helios_data_training.csv: u_id, user, gpu_num, cpu_num, node_num,
// interval, run_time, ...). interval is read as the seconds since the
// previous record's submission (it is not monotonic, so it is not a
// timestamp), so arrivals are its running sum. A job with node_num > 1
// that divides gpu_num gets gpu_num/node_num GPUs per node.
func ReadHelios(file string, r io.Reader) (*Trace, error) {
	t, err := openTable(file, r, "u_id", "gpu_num", "node_num", "interval", "run_time")
	if err != nil {
		return nil, err
	}
	tr := &Trace{Kind: KindHelios, Source: file}
	seen := map[string]int{}
	at := 0.0
	for t.next() {
		tr.Records++
		uid := t.str("u_id")
		id := "helios-" + uid
		if !jobIDPattern.MatchString(id) {
			t.bad("u_id", "expected letters, digits, '.', '_', ':' or '-', got %q", uid)
			continue
		}
		if l, dup := seen[id]; dup {
			t.bad("u_id", "job %q already listed on line %d", uid, l)
			continue
		}
		seen[id] = t.line
		gap, ok1 := t.float("interval", -maxSeconds, maxSeconds)
		dur, skip, ok2 := t.duration("run_time")
		gpus, ok3 := t.int("gpu_num", 0, maxJobGPUs)
		nodes, ok4 := t.int("node_num", 0, maxJobGPUs)
		if !ok1 || !ok3 || !ok4 || (!ok2 && skip == "") {
			continue
		}
		// The clock follows every record, skipped or not: the next
		// interval counts from this one's submission.
		at += gap
		switch {
		case skip != "":
		case gpus == 0:
			skip = SkipNoGPU
		case gap < 0:
			skip = SkipOutOfOrder
		}
		if skip != "" {
			tr.skip(skip)
			continue
		}
		j := Job{ID: id, Arrival: at, Duration: dur, GPUs: int(gpus), Line: t.line}
		if nodes > 1 && gpus%nodes == 0 {
			j.GPUsPerNode = int(gpus / nodes)
		} else if nodes == 1 {
			j.GPUsPerNode = int(gpus)
		}
		if u := t.str("user"); u != "" {
			j.Labels = map[string]string{"trace.user": cleanLabel(u)}
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	tr.sortByArrival()
	return tr, nil
}

// LoadTrace reads a job log of the given kind from disk.
func LoadTrace(kind, path string) (*Trace, error) {
	read := map[string]func(string, io.Reader) (*Trace, error){
		KindAlibaba: ReadAlibabaPods, KindITP: ReadITP, KindPhilly: ReadPhilly, KindHelios: ReadHelios,
	}[kind]
	if read == nil {
		return nil, fmt.Errorf("trace %q: expected %s, %s, %s or %s", kind, KindAlibaba, KindITP, KindPhilly, KindHelios)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("job log: %w", err)
	}
	defer func() { _ = f.Close() }() // only read
	return read(path, f)
}
