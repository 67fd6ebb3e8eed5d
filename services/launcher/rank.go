package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/placer/launch"
)

// launchError is a job the agent cannot start. Its message is the
// submitter's, and any user's who reads runtime.ranks_exited or
// jobs.finished: it names the job's field at fault (command, workdir,
// env[2], ...) and the job's own value, never the agent's environment (its
// PATH, its state directory, what its files' errors say), which go to the
// agent's log alone, as detail.
type launchError struct {
	// field is the job's field at fault; "" when the fault is the agent's.
	field string
	err   error
	// detail is for the agent's log only; "" when err says it all.
	detail string
}

func (e *launchError) Error() string {
	if e.field == "" {
		return e.err.Error()
	}
	return e.field + ": " + e.err.Error()
}

func (e *launchError) Unwrap() error { return e.err }

func fieldErr(field string, format string, args ...any) error {
	return &launchError{field: field, err: fmt.Errorf(format, args...)}
}

// agentErr is a launch that failed for the agent's own reason: the
// submitter reads what failed, the agent's log why.
func agentErr(what string, err error) *launchError {
	return &launchError{err: errors.New(what + " (the agent's log says why)"), detail: err.Error()}
}

// shown is a job's value as a message quotes it: as it is, or quoted where
// it holds what a terminal would not show plainly, and cut short.
func shown(s string) string {
	const limit = 256
	more := ""
	if len(s) > limit {
		s, more = strings.ToValidUTF8(s[:limit], ""), "..."
	}
	if s == "" || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) || r == '"' }) {
		return strconv.Quote(s) + more
	}
	return s + more
}

// pathErrText is what an error about one of the job's paths says, less
// the path (the message names it as the job gave it).
func pathErrText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// envEntry is the shape the jobs.submitted schema gives an env entry.
var envEntry = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// rankSpec is everything needed to start one rank.
type rankSpec struct {
	rank events.RankPlacement
	argv []string
	env  []string
	dir  string
	// user is who the rank runs as; nil: the agent's user.
	user *Credential
}

// plan is how the ranks of one job on this node are started.
type plan struct {
	ranks []rankSpec
	// files are the tuning files to write first (NCCL_TOPO_FILE).
	files []events.TuningFile
	// warnings say what was left out (a NUMA binding this machine cannot
	// honour), for the log.
	warnings []string
}

// planInput is what a plan is made from.
type planInput struct {
	node       string
	gpus       []int // this node's GPUs; nil when unknown
	job        *events.JobSubmitted
	decision   *events.PlacementDecided
	tuning     *events.RuntimeTuning // nil when none came
	masterAddr string
	baseEnv    []string
	// telemetryURL is the agent's telemetry endpoint, "" when off;
	// telemetryToken the job's pass to it.
	telemetryURL   string
	telemetryToken string
	// numactl is numactl's path, "" when it is not installed; numaNodes
	// reports whether this machine has a NUMA node.
	numactl   string
	numaNodes func(int) bool
	// user is the job's user (run_as) where the ranks run as another
	// than the agent; nil: as the agent.
	user *account
}

// relocate points the ranks' environment at the tuning files where the
// agent wrote them (writeTuningFiles): a variable whose value is a path
// the tuning event named gets the file's new path.
func (p *plan) relocate(moved map[string]string) {
	for i := range p.ranks {
		for j, kv := range p.ranks[i].env {
			k, v, _ := strings.Cut(kv, "=")
			if to, ok := moved[v]; ok {
				p.ranks[i].env[j] = k + "=" + to
			}
		}
	}
}

// makePlan checks the job and works out each local rank's command line
// and environment. A fault of the job is a *launchError naming its field.
func makePlan(in planInput) (*plan, error) {
	job, d := in.job, in.decision
	var mine []events.RankPlacement
	for _, r := range d.Ranks {
		if r.Node == in.node {
			mine = append(mine, r)
		}
	}
	if len(mine) == 0 {
		return nil, fieldErr("ranks", "the decision puts no rank on node %s", in.node)
	}
	for i, r := range d.Ranks {
		if r.Node == in.node && in.gpus != nil && !slices.Contains(in.gpus, r.GPU) {
			return nil, fieldErr(fmt.Sprintf("ranks[%d].gpu", i), "GPU %d is not one of node %s's GPUs %v", r.GPU, in.node, in.gpus)
		}
	}
	var np *events.NodePlacement
	groupRank := 0
	for i := range d.Nodes {
		if d.Nodes[i].Node == in.node {
			np, groupRank = &d.Nodes[i], i
		}
	}
	if np == nil {
		return nil, fieldErr("nodes", "the decision lists no entry for node %s", in.node)
	}
	if err := checkNUL(job); err != nil {
		return nil, err
	}
	jobEnv := map[string]string{}
	for i, kv := range job.Env {
		if !envEntry.MatchString(kv) {
			return nil, fieldErr(fmt.Sprintf("env[%d]", i), "%s: expected NAME=value", shown(kv))
		}
		k, v, _ := strings.Cut(kv, "=")
		jobEnv[k] = v
	}
	dir := job.Workdir
	if dir != "" {
		// Relative, it would be the agent's working directory's.
		if !filepath.IsAbs(dir) {
			return nil, fieldErr("workdir", "%s: not an absolute path", shown(dir))
		}
		st, err := os.Stat(dir)
		switch {
		case err != nil:
			return nil, fieldErr("workdir", "%s: %s", shown(dir), pathErrText(err))
		case !st.IsDir():
			return nil, fieldErr("workdir", "%s: not a directory", shown(dir))
		}
	}
	path, jobPath := jobEnv["PATH"]
	if !jobPath {
		path = lookup(in.baseEnv, "PATH")
	}
	command, err := resolveCommand(job.Command, dir, path)
	if errors.Is(err, exec.ErrNotFound) {
		// Which PATH was searched: the job's own, or the agent's, which
		// is the agent's to know.
		if jobPath {
			return nil, fieldErr("command", "%s: not found in the PATH the job's env sets", shown(job.Command))
		}
		return nil, &launchError{field: "command", err: fmt.Errorf("%s: not found in the PATH of the agent's environment (the job's env may set PATH)", shown(job.Command)),
			detail: "PATH=" + path}
	}
	if err != nil {
		return nil, &launchError{field: "command", err: err}
	}

	p := &plan{}
	if in.tuning != nil {
		for _, f := range in.tuning.Files {
			if f.Node == in.node {
				p.files = append(p.files, f)
			}
		}
	}
	port, ok := jobEnv["MASTER_PORT"]
	if !ok {
		// The decision's, which no other job running with rank 0 on
		// the same node has.
		port = strconv.Itoa(launch.MasterPort(d))
	}
	for _, r := range mine {
		env := map[string]string{}
		for _, kv := range in.baseEnv {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
		var user *Credential
		if u := in.user; u != nil {
			// Whose the rank is, not the agent's.
			env["USER"], env["LOGNAME"], env["HOME"] = u.name, u.name, u.home
			user = u.credential()
		}
		if t := in.tuning; t != nil {
			maps.Copy(env, t.Env.All)
			maps.Copy(env, t.Env.Nodes[in.node])
			maps.Copy(env, t.Env.Ranks[strconv.Itoa(r.Rank)])
		}
		maps.Copy(env, jobEnv)
		// The decision's own variables win: a rank started with another
		// RANK or device list than placement chose would break the gang.
		maps.Copy(env, map[string]string{
			"RANK":                 strconv.Itoa(r.Rank),
			"WORLD_SIZE":           strconv.Itoa(len(d.Ranks)),
			"LOCAL_RANK":           strconv.Itoa(r.LocalRank),
			"LOCAL_WORLD_SIZE":     strconv.Itoa(len(mine)),
			"GROUP_RANK":           strconv.Itoa(groupRank),
			"MASTER_ADDR":          in.masterAddr,
			"MASTER_PORT":          port,
			"CUDA_VISIBLE_DEVICES": np.CUDAVisibleDevices,
			"TOPOSCHED_JOB_ID":     job.JobID,
			"TOPOSCHED_NODE":       in.node,
			"TOPOSCHED_GPU":        strconv.Itoa(r.GPU),
		})
		if in.telemetryURL != "" {
			env[EnvTelemetryURL], env[EnvTelemetryToken] = in.telemetryURL, in.telemetryToken
		}
		argv := append([]string{command}, job.Args...)
		if r.NUMA != nil {
			switch {
			case in.numactl == "":
			case in.numaNodes != nil && !in.numaNodes(*r.NUMA):
				p.warnings = append(p.warnings, fmt.Sprintf("rank %d: NUMA node %d does not exist on this machine: not bound", r.Rank, *r.NUMA))
			default:
				n := strconv.Itoa(*r.NUMA)
				argv = append([]string{in.numactl, "--cpunodebind=" + n, "--membind=" + n}, argv...)
			}
		}
		p.ranks = append(p.ranks, rankSpec{rank: r, argv: argv, env: sortedEnv(env), dir: dir, user: user})
	}
	return p, nil
}

// resolveCommand finds the program a job names: a path (relative to the
// workdir) or a name looked up in the ranks' PATH, which the job's env may
// set. It must exist and be executable by the agent. Its errors name the
// command as the job gave it; one not in PATH is exec.ErrNotFound.
func resolveCommand(command, dir, path string) (string, error) {
	if command == "" {
		return "", errors.New("empty")
	}
	if strings.Contains(command, "/") {
		p := command
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("%s: %s", shown(command), pathErrText(err))
		}
		return p, nil
	}
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, command)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// checkNUL refuses a NUL byte in what becomes a rank's argv, environment
// or working directory: the kernel would cut the string there, or refuse
// the whole exec with an error that names the shim.
func checkNUL(job *events.JobSubmitted) error {
	has := func(s string) bool { return strings.IndexByte(s, 0) >= 0 }
	switch {
	case has(job.Command):
		return fieldErr("command", "contains a NUL byte")
	case has(job.Workdir):
		return fieldErr("workdir", "contains a NUL byte")
	}
	for i, a := range job.Args {
		if has(a) {
			return fieldErr(fmt.Sprintf("args[%d]", i), "contains a NUL byte")
		}
	}
	for i, kv := range job.Env {
		if has(kv) {
			return fieldErr(fmt.Sprintf("env[%d]", i), "contains a NUL byte")
		}
	}
	return nil
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return errors.New("is a directory")
	}
	if st.Mode()&0o111 == 0 {
		return fs.ErrPermission
	}
	return nil
}

func lookup(env []string, key string) string {
	for _, kv := range slices.Backward(env) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func sortedEnv(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return out
}
