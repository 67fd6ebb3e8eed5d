package pattern

import (
	"encoding/json"
	"fmt"

	"github.com/toposched/toposched/events"
)

// MaxAnalyzedBytes bounds the body of a job's jobs.analyzed: one message
// (events.MaxMessageBytes) less room for its headers. A job whose analysed
// form would be bigger is rejected (analysed_too_large) before its groups
// are built: NATS would refuse to carry it.
const MaxAnalyzedBytes = events.MaxMessageBytes - 16<<10

// CodeAnalysedTooLarge is the reason code of a job whose analysed form is
// over MaxAnalyzedBytes (or that the bus refused for its size).
const CodeAnalysedTooLarge = "analysed_too_large"

// Bounds of the parts of jobs.analyzed that AnalyzedSize does not count
// exactly: a derived dimension's entry (dimension, size and at most three
// collectives with their purposes; its members are left out on the wire),
// an explicit dimension's beside its name (which it holds twice, as name
// and in its purpose; its members are the job's), and the top level
// beside the job and the groups (degrees, order, volumes and warnings).
const (
	dimensionOverhead = 1 << 10
	customOverhead    = 512
	topOverhead       = 4 << 10
)

// AnalyzedSize is the size in bytes of the JSON body of job's jobs.analyzed
// with the degrees p, worked out before any group is built: exact for the
// job (which holds all but a few KB of a big job's event, since the
// compact form lists no rank twice: see events.JobAnalyzed.MarshalJSON)
// and an upper bound for the rest. derived and explicit are the parts of
// total that the derived dimensions and the explicit groups take (the
// latter as the job lists them, and their custom dimensions' entries).
func AnalyzedSize(job events.JobSubmitted, p events.Parallelism) (total, derived, explicit int) {
	groups := job.Groups
	job.Groups = nil
	// A JobSubmitted always encodes; on an error nothing is counted
	// rather than a panic.
	body, _ := json.Marshal(job)
	if len(groups) > 0 {
		g, _ := json.Marshal(groups)
		explicit += len(`,"groups":`) + len(g)
	}
	for _, size := range []int{p.TP, p.CP, p.EP, p.DP, p.PP} {
		if size > 1 {
			derived += dimensionOverhead
		}
	}
	names := map[string]bool{}
	for _, g := range groups {
		if names[g.Name] {
			continue
		}
		names[g.Name] = true
		quoted, _ := json.Marshal(g.Name)
		explicit += customOverhead + 2*len(quoted)
	}
	return len(body) + derived + explicit + topOverhead, derived, explicit
}

// mib renders a size for a reason.
func mib(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
