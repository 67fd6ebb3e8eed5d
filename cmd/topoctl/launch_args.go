package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/client"
	"github.com/toposched/toposched/internal/placer/launch"
)

// Launchers launch-args writes command lines for.
var launchers = []string{"torchrun", "mpirun", "srun"}

func newLaunchArgs(g *globals) *cobra.Command {
	var forLauncher, rankfile string
	cmd := &cobra.Command{
		Use:   "launch-args JOB --for torchrun|mpirun|srun",
		Short: "Print the command line that starts a placed job with torchrun, mpirun or srun",
		Long: `launch-args reads the job's decision and prints, for a launcher of your own, the
exact command line that starts its ranks where placement put them, with the
job's command and args (or COMMAND where it names none):

  torchrun  one line per node, run on that node (CUDA_VISIBLE_DEVICES and
            torchrun's --nnodes, --node_rank, --nproc_per_node, --master_addr,
            --master_port; a command that is not python gets --no_python)
  mpirun    one line for the whole job; the decision's Open MPI rankfile is
            written to --rankfile (default JOB.rankfile) and each rank gets
            its node's CUDA_VISIBLE_DEVICES
  srun      one line, a component per node: --nodelist, --ntasks and
            --gpu-bind=map_gpu: with the node's GPUs in local-rank order

The rendezvous is the decision's (MASTER_ADDR, MASTER_PORT: a port no other
job running with rank 0 on that node has), given to mpirun's and srun's
ranks; a MASTER_ADDR or MASTER_PORT in the job's env wins, in torchrun's
arguments too.`,
		Example: `  topoctl launch-args llm-tp8-dp2 --for torchrun
  topoctl launch-args llm-tp8-dp2 --for mpirun --rankfile /shared/llm.rankfile`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !slices.Contains(launchers, forLauncher) {
				return fmt.Errorf("--for %q: expected one of %s", forLauncher, strings.Join(launchers, ", "))
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
			last := h.LastOutcome()
			d, ok := lastDecision(last)
			if !ok || h.State == client.StateFinished {
				return fmt.Errorf("%s: not placed now (%s)", args[0], h.State)
			}
			if forLauncher == "mpirun" {
				if rankfile == "" {
					rankfile = args[0] + ".rankfile"
				}
				if d.Launch == nil {
					return fmt.Errorf("%s: the decision has no rankfile", args[0])
				}
				if err := os.WriteFile(rankfile, []byte(d.Launch.MPIRankfile), 0o644); err != nil {
					return fmt.Errorf("--rankfile: %w", err)
				}
			}
			return writeLaunchArgs(cmd.OutOrStdout(), forLauncher, d, h.Submission(), rankfile)
		},
	}
	cmd.Flags().StringVar(&forLauncher, "for", "torchrun", "launcher: "+strings.Join(launchers, ", "))
	cmd.Flags().StringVar(&rankfile, "rankfile", "", "with --for mpirun: where to write the Open MPI rankfile (default JOB.rankfile)")
	return cmd
}

func lastDecision(e *client.HistoryEvent) (*events.PlacementDecided, bool) {
	if e == nil {
		return nil, false
	}
	d, ok := e.Data.(*events.PlacementDecided)
	return d, ok
}

// writeLaunchArgs prints the command lines of one launcher for a decision.
func writeLaunchArgs(w io.Writer, launcher string, d *events.PlacementDecided, job *events.JobSubmitted, rankfile string) error {
	command := []string{"COMMAND"}
	if job != nil && job.Command != "" {
		command = append([]string{job.Command}, job.Args...)
	}
	var envs []string
	if job != nil {
		envs = job.Env
	}
	// The rendezvous the ranks of mpirun and srun are told, and torchrun
	// is given; the job's env wins, as with the agents.
	var rdv []string
	if d.Launch != nil {
		rdv = []string{"MASTER_ADDR=" + d.Launch.MasterAddr, "MASTER_PORT=" + strconv.Itoa(launch.MasterPort(d))}
	}
	rdv = slices.DeleteFunc(rdv, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.ContainsFunc(envs, func(e string) bool { return strings.HasPrefix(e, name+"=") })
	})
	var b strings.Builder
	switch launcher {
	case "torchrun":
		// torchrun runs a Python script itself; anything else it must be
		// told to start as it is.
		script := append([]string{"--no_python"}, command...)
		if job != nil && strings.HasPrefix(filepath.Base(job.Command), "python") && len(job.Args) > 0 {
			script = job.Args
		}
		for _, np := range d.Nodes {
			if len(np.Torchrun) == 0 {
				return fmt.Errorf("%s: its ranks are not in node-contiguous blocks, which torchrun needs: use mpirun or srun", d.JobID)
			}
			fmt.Fprintf(&b, "# on %s\n", np.Node)
			line := append(append([]string{"CUDA_VISIBLE_DEVICES=" + np.CUDAVisibleDevices}, envs...), "torchrun")
			line = append(append(line, torchrunArgs(np.Torchrun, envs)...), script...)
			b.WriteString(shellJoin(line) + "\n")
		}
	case "mpirun":
		line := []string{"mpirun", "-np", strconv.Itoa(len(d.Ranks)), "--rankfile", rankfile}
		devices := map[string]bool{}
		for _, np := range d.Nodes {
			devices[np.CUDAVisibleDevices] = true
		}
		if len(devices) == 1 {
			line = append(line, "-x", "CUDA_VISIBLE_DEVICES="+d.Nodes[0].CUDAVisibleDevices)
		} else {
			// mpirun's -x is one value for every node: each node's own
			// list is set by a shell around the command.
			var cases []string
			for _, np := range d.Nodes {
				cases = append(cases, shellQuote(np.Node)+") export CUDA_VISIBLE_DEVICES="+np.CUDAVisibleDevices+";;")
			}
			command = append([]string{"sh", "-c", `case "$(hostname)" in ` + strings.Join(cases, " ") + ` esac; exec "$@"`, "sh"}, command...)
		}
		for _, kv := range append(rdv, envs...) {
			line = append(line, "-x", kv)
		}
		b.WriteString(shellJoin(append(line, command...)) + "\n")
	case "srun":
		var parts []string
		for _, np := range d.Nodes {
			part := []string{"--nodelist=" + np.Node, "--nodes=1", "--ntasks=" + strconv.Itoa(len(np.GPUs)), "--gpu-bind=" + np.SlurmGPUBind}
			if exports := append(slices.Clone(rdv), envs...); len(exports) > 0 {
				part = append(part, "--export=ALL,"+strings.Join(exports, ","))
			}
			parts = append(parts, shellJoin(append(part, command...)))
		}
		b.WriteString("srun " + strings.Join(parts, " : ") + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// torchrunArgs are the decision's torchrun arguments, with the job env's
// MASTER_ADDR and MASTER_PORT, when it sets them, in place of the
// decision's: torchrun's arguments win over the environment.
func torchrunArgs(args, envs []string) []string {
	out := slices.Clone(args)
	for _, kv := range envs {
		name, v, _ := strings.Cut(kv, "=")
		flag := map[string]string{"MASTER_ADDR": "--master_addr=", "MASTER_PORT": "--master_port="}[name]
		if flag == "" {
			continue
		}
		for i, a := range out {
			if strings.HasPrefix(a, flag) {
				out[i] = flag + v
			}
		}
	}
	return out
}

// safeWord needs no quoting in a POSIX shell.
var safeWord = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

func shellQuote(s string) string {
	if safeWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = shellQuote(w)
	}
	return strings.Join(q, " ")
}
