package slurm

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/formats/fabric"
)

// CommentPrefix starts the comment of every Slurm job that runs a
// toposched job: "toposched-job=<job id>".
const CommentPrefix = "toposched-job="

// PlaceholderSuffix ends the comment of a placeholder: the held Slurm job
// topoctl run --slurm submits while toposched has the job pending, so
// that Slurm's users see it in squeue and can scancel it
// ("toposched-job=<job id> (placeholder)"). It never runs the job: its
// end is not the job's, and the job's GPUs are not its.
const PlaceholderSuffix = " (placeholder)"

// Job is one job as squeue --json shows it.
type Job struct {
	ID    int
	Name  string
	User  string
	State string
	// Comment is the job's --comment; ToposchedJob is the toposched job
	// id it names ("" for a job that is not toposched's).
	Comment      string
	ToposchedJob string
	// Placeholder is set for a toposched job's placeholder
	// (PlaceholderSuffix).
	Placeholder bool
	// Nodes are the job's nodes in Slurm's order (none while pending).
	Nodes []string
	// GPUs are the GRES indices of the GPUs the job holds, per node.
	GPUs map[string][]int
}

// squeueDoc is the part of squeue --json (openapi v0.0.38, Slurm 22.05)
// the service reads.
type squeueDoc struct {
	Errors []struct {
		Description string `json:"description"`
		Error       string `json:"error"`
		Source      string `json:"source"`
	} `json:"errors"`
	Jobs []struct {
		JobID      int      `json:"job_id"`
		Name       string   `json:"name"`
		UserName   string   `json:"user_name"`
		JobState   string   `json:"job_state"`
		Comment    string   `json:"comment"`
		Nodes      string   `json:"nodes"`
		GresDetail []string `json:"gres_detail"`
	} `json:"jobs"`
}

// ParseSqueue reads squeue --json's output. A document with errors is a
// failed read, not an empty queue: squeue exits 0 and lists no jobs, with
// "Failed while looking for jobs" in errors, when slurmctld is down.
func ParseSqueue(data []byte) ([]Job, error) {
	var doc squeueDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("squeue --json: %w", err)
	}
	if len(doc.Errors) > 0 {
		var msgs []string
		for _, e := range doc.Errors {
			msgs = append(msgs, fmt.Sprintf("%s: %s (%s)", e.Source, e.Description, e.Error))
		}
		return nil, fmt.Errorf("squeue --json: errors: %s", strings.Join(msgs, "; "))
	}
	jobs := make([]Job, 0, len(doc.Jobs))
	for _, j := range doc.Jobs {
		job := Job{ID: j.JobID, Name: j.Name, User: j.UserName, State: j.JobState, Comment: j.Comment, GPUs: map[string][]int{}}
		if id, ok := strings.CutPrefix(strings.TrimSpace(j.Comment), CommentPrefix); ok {
			job.ToposchedJob = id
			// Job ids have no space (events.ValidJobID): the suffix is
			// never part of one.
			if id, ok := strings.CutSuffix(id, PlaceholderSuffix); ok {
				job.ToposchedJob, job.Placeholder = id, true
			}
		}
		if j.Nodes != "" {
			nodes, err := fabric.ExpandHostlist(j.Nodes)
			if err != nil {
				return nil, fmt.Errorf("squeue --json: job %d: nodes %q: %w", j.JobID, j.Nodes, err)
			}
			job.Nodes = nodes
		}
		// gres_detail has one entry per node, in the order of nodes.
		if len(j.GresDetail) > len(job.Nodes) {
			return nil, fmt.Errorf("squeue --json: job %d: gres_detail has %d entries for %d nodes", j.JobID, len(j.GresDetail), len(job.Nodes))
		}
		for k, d := range j.GresDetail {
			idx, err := GresIndices(d)
			if err != nil {
				return nil, fmt.Errorf("squeue --json: job %d: gres_detail of %s: %w", j.JobID, job.Nodes[k], err)
			}
			if len(idx) > 0 {
				job.GPUs[job.Nodes[k]] = idx
			}
		}
		jobs = append(jobs, job)
	}
	return jobs, nil
}

// maxGRESIndex bounds an index read from gres_detail, so that a range
// such as IDX:0-999999999 cannot make a huge list.
const maxGRESIndex = 4095

// GresIndices reads the GPU indices of one gres_detail entry, sorted:
// "gpu:h100:2(IDX:2-3)", or with a type per GPU
// "gpu:g0:0(IDX:),gpu:g1:1(IDX:1),gpu:g2:1(IDX:3)". GRES other than gpu
// are passed over.
func GresIndices(detail string) ([]int, error) {
	var idx []int
	for _, entry := range splitGres(detail) {
		if !strings.HasPrefix(entry, "gpu:") && !strings.HasPrefix(entry, "gpu(") {
			continue
		}
		_, after, ok := strings.Cut(entry, "(IDX:")
		if !ok {
			continue // a count without indices
		}
		list, _, ok := strings.Cut(after, ")")
		if !ok {
			return nil, fmt.Errorf("%q: no ')' closes IDX", detail)
		}
		for part := range strings.SplitSeq(list, ",") {
			if part == "" {
				continue
			}
			lo, hi, isRange := strings.Cut(part, "-")
			if !isRange {
				hi = lo
			}
			l, err1 := strconv.Atoi(lo)
			h, err2 := strconv.Atoi(hi)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("%q: index %q: %w", detail, part, err)
			}
			if l < 0 || l > h || h > maxGRESIndex {
				return nil, fmt.Errorf("%q: index range %q out of 0-%d", detail, part, maxGRESIndex)
			}
			for i := l; i <= h; i++ {
				idx = append(idx, i)
			}
		}
	}
	slices.Sort(idx)
	return slices.Compact(idx), nil
}

// splitGres splits a gres_detail entry at the commas between GRES, not
// those inside an (IDX:...) list.
func splitGres(detail string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range detail {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, detail[start:i])
				start = i + 1
			}
		}
	}
	return append(out, detail[start:])
}
