package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/placer/launch"
)

// slurmFormats are what slurm-args prints.
var slurmFormats = []string{"srun", "sbatch"}

func newSlurmArgs(g *globals) *cobra.Command {
	var (
		format     string
		tuningWait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "slurm-args JOB [--format srun|sbatch]",
		Short: "Print the srun line or sbatch script that runs a placed job on exactly its decided Slurm nodes and GPUs",
		Long: `slurm-args reads the job's decision and prints how to run it through Slurm
where placement put it. Nodes with the same GPUs make one job component
(--nodelist of them all, --ntasks-per-node); nodes with different GPUs a
heterogeneous job, one component per node in node order (Slurm starts those
from its backfill scheduler only: up to bf_interval later). Each has

  --nodelist, --nodes, --ntasks     the nodes and their ranks
  --gres=gpu:g<i>:1,...             exactly the decided GPUs: needs the
                                    per-index GRES types of
                                    toposched slurm-conf --index-types
  --gpu-bind=map_gpu:...            each local rank's GPU
  --cpu-bind=map_ldom:...           each local rank's NUMA node, where known
  --export=ALL,...                  MASTER_ADDR, MASTER_PORT, WORLD_SIZE, the
                                    decision's runtime.tuning variables for
                                    every rank (NCCL_ALGO, ...) and the
                                    job's env
  --chdir                           the job's workdir
  --job-name=JOB --comment=toposched-job=JOB   the link to the toposched job

and the job's command, run by a /bin/sh -c wrapper that sets RANK and
LOCAL_RANK from Slurm's task ids and applies the rest of the decision's
runtime.tuning as the node agents do: each node's and each rank's variables
(a case on $SLURMD_NODENAME and on RANK; every value shell-quoted), the
variables --export cannot carry (a comma in the value), and the files a
variable names (NCCL_TOPO_FILE's topology XML), each written on its node into
a fresh private temp file (mktemp, under $TMPDIR or /tmp) whose path the
variable gets, removed when the rank exits. The order is the agents': the
tuning for all ranks, then the node's, then the rank's, then the job's env,
then the decision's own variables. The tuning is waited for up to
--tuning-wait; without it, the job is printed without it (said on stderr).
One argument may have at most 128 KiB (Linux's MAX_ARG_STRLEN): a wrapper
over that, with many nodes' files, is an error.

--format sbatch prints a batch script of the same job (#SBATCH lines,
components joined by "#SBATCH hetjob", then one srun).
topoctl run --slurm runs the srun line itself and finishes the job.`,
		Example: `  topoctl slurm-args llm-tp8-dp2
  topoctl slurm-args llm-tp8-dp2 --format sbatch > llm.sbatch && sbatch llm.sbatch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !slices.Contains(slurmFormats, format) {
				return fmt.Errorf("--format %q: expected one of %s", format, strings.Join(slurmFormats, ", "))
			}
			ctx := cmd.Context()
			b, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer closeBus(b)
			h, err := client.History(ctx, b, args[0])
			if err != nil {
				return err
			}
			d, ok := lastDecision(h.LastOutcome())
			if !ok || h.State == client.StateFinished {
				return fmt.Errorf("%s: not placed now (%s)", args[0], h.State)
			}
			if tuningWait < 0 {
				return fmt.Errorf("--tuning-wait %s: must not be negative", tuningWait)
			}
			tuning, err := readTuning(ctx, b, d, tuningWait)
			if err != nil {
				return err
			}
			if tuning == nil {
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "%s: no runtime.tuning for its decision within %s: printed without it\n", args[0], tuningWait)
			}
			comps, err := slurmComponents(d, h.Submission(), tuning)
			if err != nil {
				return err
			}
			if format == "sbatch" {
				return writeSbatch(cmd.OutOrStdout(), comps)
			}
			_, err = io.WriteString(cmd.OutOrStdout(), shellJoin(append([]string{"srun"}, srunArgv(comps)...))+"\n")
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "srun", "what to print: "+strings.Join(slurmFormats, ", "))
	cmd.Flags().DurationVar(&tuningWait, "tuning-wait", defaultTuningWait,
		"how long to wait for the decision's runtime.tuning if the optimizer has not published it yet (0: only one already published)")
	return cmd
}

// slurmComponent is one node's part of the heterogeneous Slurm job.
type slurmComponent struct {
	// Alloc are the options of the allocation (sbatch's or srun's).
	Alloc []string
	// Step are the options of the job step on it (srun's only).
	Step []string
	// Command is what every task of the component runs.
	Command []string
}

// slurmComponents turns a decision into one Slurm job component per node,
// in node order. Each component asks for the node's GPUs by their
// per-index GRES types: a count of one --gres applies to every node of a
// component, so nodes with different GPUs cannot share one.
//
// The tuning, nil when none came, is applied as the agents apply it (see
// slurmTuning): All's variables through --export where it can carry them,
// the rest, each node's and each rank's, and the files they name, by the
// /bin/sh -c wrapper every task runs.
func slurmComponents(d *events.PlacementDecided, job *events.JobSubmitted, tuning *events.RuntimeTuning) ([]slurmComponent, error) {
	comps, err := slurmComponentsOf(d, job, tuning)
	if err != nil {
		return nil, err
	}
	for _, c := range comps {
		for _, w := range slices.Concat(c.Alloc, c.Step, c.Command) {
			if len(w) <= maxArgBytes {
				continue
			}
			what := strings.SplitN(w, "=", 2)[0]
			if !strings.HasPrefix(w, "-") {
				what = "the rank wrapper's script (sh -c)"
				if tuning != nil {
					what += ", with the runtime.tuning's variables and files,"
				}
			}
			return nil, fmt.Errorf("%s: %s is %d bytes, over the %d one argument may have (Linux's MAX_ARG_STRLEN)", d.JobID, what, len(w), maxArgBytes)
		}
	}
	return comps, nil
}

// slurmComponentsOf is slurmComponents without the check of the
// arguments' sizes.
func slurmComponentsOf(d *events.PlacementDecided, job *events.JobSubmitted, tuning *events.RuntimeTuning) ([]slurmComponent, error) {
	if len(d.Nodes) == 0 {
		return nil, fmt.Errorf("%s: the decision places no node", d.JobID)
	}
	command := []string{"COMMAND"}
	var envs []string
	workdir := ""
	if job != nil {
		if job.Command != "" {
			command = append([]string{job.Command}, job.Args...)
		}
		envs, workdir = job.Env, job.Workdir
	}
	// SLURM_PROCID numbers the tasks of a heterogeneous step across its
	// components in order: it is the job's rank only if the ranks are in
	// node blocks in the nodes' order, local ranks in order.
	byNode := map[string][]events.RankPlacement{}
	for _, r := range d.Ranks {
		byNode[r.Node] = append(byNode[r.Node], r)
	}
	next := 0
	for _, np := range d.Nodes {
		rs := byNode[np.Node]
		slices.SortFunc(rs, func(a, b events.RankPlacement) int { return a.LocalRank - b.LocalRank })
		for l, r := range rs {
			if r.Rank != next || r.LocalRank != l {
				return nil, fmt.Errorf("%s: rank %d on node %s (local rank %d): the ranks are not in node blocks in node order, which SLURM_PROCID needs", d.JobID, r.Rank, np.Node, r.LocalRank)
			}
			next++
		}
		if len(rs) != len(np.GPUs) {
			return nil, fmt.Errorf("%s: node %s: %d ranks for %d GPUs", d.JobID, np.Node, len(rs), len(np.GPUs))
		}
	}
	exports := []string{"WORLD_SIZE=" + strconv.Itoa(len(d.Ranks))}
	if d.Launch != nil {
		exports = append(exports, "MASTER_ADDR="+d.Launch.MasterAddr, "MASTER_PORT="+strconv.Itoa(launch.MasterPort(d)))
	}
	// The job's env wins, as with the agents.
	exports = slices.DeleteFunc(exports, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.ContainsFunc(envs, func(e string) bool { return strings.HasPrefix(e, name+"=") })
	})
	for i, kv := range envs {
		// --export's list is comma-separated, with no escape.
		if strings.Contains(kv, ",") {
			return nil, fmt.Errorf("%s: env[%d] %q: a comma cannot pass through srun --export", d.JobID, i, kv)
		}
	}
	tuned, err := slurmTuning(d, tuning, envs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.JobID, err)
	}
	exports = append(exports, tuned.exports...)
	exports = append(exports, envs...)
	// wrap ends the wrapper: RANK set by rankLine, the tuning applied
	// to the ranks of nodes, the command run. With tuning files it stays
	// to remove them once the command exits.
	wrap := func(rankLine string, nodes []string) string {
		var ranks []int
		for _, n := range nodes {
			for _, r := range byNode[n] {
				ranks = append(ranks, r.Rank)
			}
		}
		ts := tuned.script(nodes, ranks)
		if ts == "" {
			return rankLine + ` LOCAL_RANK=$SLURM_LOCALID exec "$@"`
		}
		run := `exec "$@"`
		if tuned.filesOn(nodes) > 0 {
			run = `"$@"; exit $?`
		}
		return rankLine + "; " + ts + `; RANK=$RANK LOCAL_RANK=$SLURM_LOCALID ` + run
	}
	step := func(np events.NodePlacement) ([]string, error) {
		if np.SlurmGPUBind == "" {
			return nil, fmt.Errorf("%s: node %s: the decision has no slurm_gpu_bind", d.JobID, np.Node)
		}
		opts := []string{"--gpu-bind=" + np.SlurmGPUBind}
		if ldoms := numaMap(byNode[np.Node]); ldoms != "" {
			opts = append(opts, "--cpu-bind=map_ldom:"+ldoms)
		}
		opts = append(opts, "--export=ALL,"+strings.Join(exports, ","))
		if workdir != "" {
			opts = append(opts, "--chdir="+workdir)
		}
		return opts, nil
	}
	link := []string{"--job-name=" + d.JobID, "--comment=toposched-job=" + d.JobID}

	if uniform(d, byNode) {
		// One component: Slurm's backfill scheduler alone starts
		// heterogeneous jobs (every bf_interval, 30 s by default), the
		// main one starts this at once. Slurm orders the tasks by its own
		// node order, not the nodelist's: each task's rank comes from its
		// node's first rank and its local rank.
		np := d.Nodes[0]
		opts, err := step(np)
		if err != nil {
			return nil, err
		}
		nodes := make([]string, len(d.Nodes))
		var cases []string
		for i, n := range d.Nodes {
			nodes[i] = n.Node
			cases = append(cases, shellQuote(n.Node)+") R="+strconv.Itoa(i*len(np.GPUs))+";;")
		}
		run := append([]string{"/bin/sh", "-c", `case "$SLURMD_NODENAME" in ` + strings.Join(cases, " ") +
			` *) echo "toposched: node $SLURMD_NODENAME is not the job's" >&2; exit 1;; esac; ` + wrap(`RANK=$((R+SLURM_LOCALID))`, nodes), "sh"}, command...)
		return []slurmComponent{{
			Alloc: append(slices.Clone(link), "--nodelist="+strings.Join(nodes, ","), "--nodes="+strconv.Itoa(len(nodes)),
				"--ntasks-per-node="+strconv.Itoa(len(np.GPUs)), "--ntasks="+strconv.Itoa(len(d.Ranks)), "--gres="+gresOf(np.GPUs)),
			Step:    opts,
			Command: run,
		}}, nil
	}

	// One component per node: a --gres count holds for every node of a
	// component. SLURM_PROCID numbers the tasks of a heterogeneous step
	// across its components in order, which is the ranks' (checked above).
	comps := make([]slurmComponent, 0, len(d.Nodes))
	for _, np := range d.Nodes {
		opts, err := step(np)
		if err != nil {
			return nil, err
		}
		run := append([]string{"/bin/sh", "-c", wrap(`RANK=$SLURM_PROCID`, []string{np.Node}), "sh"}, command...)
		comps = append(comps, slurmComponent{
			Alloc:   append(slices.Clone(link), "--nodelist="+np.Node, "--nodes=1", "--ntasks="+strconv.Itoa(len(np.GPUs)), "--gres="+gresOf(np.GPUs)),
			Step:    opts,
			Command: run,
		})
	}
	return comps, nil
}

// uniform reports whether every node of the decision has the same GPUs,
// local ranks bound alike, and NUMA nodes alike, so that one Slurm job
// component fits them all.
func uniform(d *events.PlacementDecided, byNode map[string][]events.RankPlacement) bool {
	first := d.Nodes[0]
	for _, np := range d.Nodes[1:] {
		if gresOf(np.GPUs) != gresOf(first.GPUs) || np.SlurmGPUBind != first.SlurmGPUBind ||
			numaMap(byNode[np.Node]) != numaMap(byNode[first.Node]) {
			return false
		}
	}
	return true
}

// gresOf asks for exactly gpus by their per-index GRES types.
func gresOf(gpus []int) string {
	gres := make([]string, 0, len(gpus))
	for _, g := range slices.Sorted(slices.Values(gpus)) {
		gres = append(gres, "gpu:g"+strconv.Itoa(g)+":1")
	}
	return strings.Join(gres, ",")
}

// numaMap is the NUMA node of each local rank, or "" where one is
// unknown.
func numaMap(rs []events.RankPlacement) string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		if r.NUMA == nil {
			return ""
		}
		ids[i] = strconv.Itoa(*r.NUMA)
	}
	return strings.Join(ids, ",")
}

// srunArgv is srun's arguments for the whole job, components joined by ":".
func srunArgv(comps []slurmComponent) []string {
	var argv []string
	for i, c := range comps {
		if i > 0 {
			argv = append(argv, ":")
		}
		argv = append(argv, c.Alloc...)
		argv = append(argv, c.Step...)
		argv = append(argv, c.Command...)
	}
	return argv
}

// writeSbatch prints a batch script of the job: one #SBATCH component per
// node, then the srun that starts every component's tasks in the
// allocation.
func writeSbatch(w io.Writer, comps []slurmComponent) error {
	if len(comps) == 0 {
		return errors.New("no component")
	}
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for i, c := range comps {
		if i > 0 {
			b.WriteString("#SBATCH hetjob\n")
		}
		for _, o := range c.Alloc {
			// sbatch reads these words as they are, quotes included.
			fmt.Fprintf(&b, "#SBATCH %s\n", o)
		}
	}
	var step []string
	for i, c := range comps {
		if i > 0 {
			step = append(step, ":")
		}
		if len(comps) > 1 {
			step = append(step, "--het-group="+strconv.Itoa(i))
		}
		step = append(step, c.Step...)
		step = append(step, c.Command...)
	}
	b.WriteString(shellJoin(append([]string{"srun"}, step...)) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}
