package pattern

import (
	"encoding/json"
	"fmt"
	"strconv"

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
// exactly: what a dimension's entry holds beside its members (dimension,
// size and at most three collectives with their purposes), what an
// explicit dimension's holds beside its members and name (which it holds
// twice, as name and in its purpose), and the top level beside the job
// and the groups (degrees, order, volumes and warnings).
const (
	dimensionOverhead = 1 << 10
	customOverhead    = 512
	topOverhead       = 4 << 10
)

// AnalyzedSize is the size in bytes of the JSON body of job's jobs.analyzed
// with the degrees p, worked out before any group is built: exact for the
// rank lists, which are all but a few KB of a big job's, and an upper
// bound for the rest. Every derived dimension of degree above 1 lists all
// gpus ranks once; explicit groups are listed twice, in the job and as
// custom dimensions. derived and explicit are the parts of total those
// take.
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
	n := job.GPUs
	for _, size := range []int{p.TP, p.CP, p.EP, p.DP, p.PP} {
		if size <= 1 || n%size != 0 {
			continue
		}
		derived += dimensionOverhead + membersSize(n, n/size)
	}
	names := map[string]int{}
	for _, g := range groups {
		names[g.Name]++
		explicit += 1 + rankListSize(g.Ranks) // and its comma
	}
	for name, groups := range names {
		quoted, _ := json.Marshal(name)
		explicit += customOverhead + 2*len(quoted) + 2 + groups - 1
	}
	return len(body) + derived + explicit + topOverhead, derived, explicit
}

// membersSize is the length of the JSON of the ranks 0..n-1 in g lists of
// n/g each: the brackets and commas of the outer list (g+1) and of each
// group (n+g), and the digits of every rank.
func membersSize(n, g int) int {
	return 1 + 2*g + n + digits(n)
}

// digits is the number of decimal digits of 0, 1, ..., n-1 together:
// the numbers of w digits are those in [10^(w-1), 10^w), and 0 has one.
func digits(n int) int {
	total := 0
	for lo, hi, width := 0, 10, 1; lo < n; lo, hi, width = hi, hi*10, width+1 {
		total += (min(hi, n) - lo) * width
	}
	return total
}

// rankListSize is the length of the JSON of one list of ranks.
func rankListSize(ranks []int) int {
	size := 2 + max(len(ranks)-1, 0)
	for _, r := range ranks {
		size += numberSize(r)
	}
	return size
}

// numberSize is the length of an integer in JSON.
func numberSize(r int) int {
	if r < 0 {
		return len(strconv.Itoa(r)) // no rank Analyze lets through
	}
	n := 1
	for ; r >= 10; r /= 10 {
		n++
	}
	return n
}

// mib renders a size for a reason.
func mib(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
