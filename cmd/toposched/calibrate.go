package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/internal/collective"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/formats/nccltests"
	"github.com/toposched/toposched/internal/topology"
)

type calibrateFlags struct {
	topology, collective, algo, name, out string
	model, into                           string
	nodes                                 int
	ncclTests                             []string
}

func newModelCalibrate() *cobra.Command {
	var f calibrateFlags
	cmd := &cobra.Command{
		Use:   "calibrate --topology FILE --nccl-tests FILE... --out SET.json",
		Short: "Fit the cost model's link efficiencies to nccl-tests measurements",
		Long: `calibrate reads nccl-tests outputs (all_reduce_perf, all_gather_perf,
reduce_scatter_perf, sendrecv_perf) measured on the machine the topology file
describes (nvidia-smi topo -m or NCCL XML; --nodes of it for a multi-node
run), and fits the share of line rate each kind of link achieves there
(NVLink, NVLS, PCIe, network) from the messages of 128 MiB and more: each is
scaled by the median of measured over predicted bus bandwidth of the
measurements it bounds. The efficiencies do not depend on the collective, so
a sweep of one predicts the others. It writes a calibration set that
model predict --calibration reads.

A file may hold several runs (one log of all_reduce_perf, all_gather_perf,
...): each is read with the collective its command line or "# Collective
test starting" line names, else the file's name, else --collective (which
overrides them all). Runs of broadcast or reduce, and runs on 1 rank, are
skipped with a note; so are rows whose data check found wrong elements.
Every nccl-tests layout since 2017 reads, with MPI and Slurm rank prefixes,
NCCL INFO lines and rows of size 0.

A file that is cut off, a number that cannot be (a negative time), an
algorithm bandwidth that is not the size over the time, a bus bandwidth
that is not the algorithm bandwidth times the collective's factor for the
run's rank count (2(n-1)/n for all_reduce, (n-1)/n for all_gather
and reduce_scatter), a run on another number of ranks than the topology
gives, or a bus bandwidth above what the links could carry at line rate (a
measurement of another topology) is refused with the file, the line and the
reason; so is a fit below its kind of link's floor (no real machine is
that slow: docs/cost-model.md,
"Calibration floors"), naming the measurements. Nothing is written
then. A fit more than 3 times from the documented efficiency is written, with
a warning on stderr naming the link and the factor.

The set names each measurement file:line relative to the working directory
when the file lies under it, else by its base name: never by an absolute
path, which everyone who reads the calibration bucket would see.

  toposched model calibrate --topology node.txt \
      --nccl-tests all_reduce_perf.txt --out node-calibration.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCalibrate(cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.topology, "topology", "", "topology file of the machine measured (nvidia-smi topo -m output or NCCL XML)")
	fl.IntVar(&f.nodes, "nodes", 1, "nodes of that topology the measurements ran on, all their GPUs each")
	fl.StringSliceVar(&f.ncclTests, "nccl-tests", nil, "nccl-tests output files (comma separated or repeated)")
	fl.StringVar(&f.collective, "collective", "", "the files' collective (default: each run's from its command line in the log, else from the file's name: all_reduce, all_gather, reduce_scatter, sendrecv or alltoall)")
	fl.StringVar(&f.algo, "algorithm", "auto", "the algorithm NCCL ran (NCCL_ALGO), or auto for NCCL's own choice")
	fl.StringVar(&f.name, "name", "", "name of the set (default: the topology file's)")
	fl.StringVar(&f.out, "out", "", "calibration set to write (JSON)")
	fl.StringVar(&f.model, "model", "", "the GPU model of the nodes measured: the efficiencies are written for nodes of that model only (models.<model>), so that one set holds a heterogeneous cluster's")
	fl.StringVar(&f.into, "into", "", "with --model: add to this existing set (its other models and its cluster-wide efficiencies stay) instead of a new one")
	return cmd
}

func runCalibrate(stdout, stderr io.Writer, f calibrateFlags) error {
	switch {
	case f.topology == "":
		return errors.New("model calibrate: --topology is required")
	case len(f.ncclTests) == 0:
		return errors.New("model calibrate: --nccl-tests is required")
	case f.out == "":
		return errors.New("model calibrate: --out is required")
	case f.nodes < 1:
		return fmt.Errorf("model calibrate: --nodes %d: expected at least 1", f.nodes)
	}
	algo, err := collective.ParseAlgorithm(f.algo)
	if err != nil {
		return fmt.Errorf("model calibrate: --algorithm: %w", err)
	}
	ev, err := clusterfile.LoadNodeFile(f.topology, clusterfile.NodeFileOptions{})
	if err != nil {
		return fmt.Errorf("model calibrate: %w", err)
	}
	var nodes []*topology.Node
	for i := range f.nodes {
		n, err := topology.FromEvent(ev)
		if err != nil {
			return fmt.Errorf("model calibrate: %w", err)
		}
		n.Name = fmt.Sprintf("%s-%d", filepath.Base(f.topology), i)
		nodes = append(nodes, n)
	}
	p := collective.Placement{Ranks: collective.NodesRanks(nodes, len(nodes[0].GPUs))}
	wd, err := os.Getwd()
	if err != nil {
		wd = "" // base names only
	}
	var samples []collective.Sample
	for _, file := range f.ncclTests {
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("model calibrate: %w", err)
		}
		res, err := nccltests.Parse(file, data)
		if err != nil {
			return fmt.Errorf("model calibrate: %w", err)
		}
		s, err := fileSamples(stderr, res, f.collective, algo, p, sourceName(file, wd))
		if err != nil {
			return fmt.Errorf("model calibrate: %w", err)
		}
		samples = append(samples, s...)
	}
	name := f.name
	if name == "" {
		name = filepath.Base(f.topology)
	}
	cal, err := collective.FitCalibration(name, samples, nil)
	if err != nil {
		return fmt.Errorf("model calibrate: %w", err)
	}
	switch {
	case f.into != "" && f.model == "":
		return errors.New("model calibrate: --into goes with --model")
	case f.model != "":
		var into *collective.Calibration
		if f.into != "" {
			if into, err = loadCalibration(f.into); err != nil {
				return fmt.Errorf("model calibrate: --into: %w", err)
			}
		}
		cal = cal.ForModel(f.model, into)
		// A set merged into may have been written before sources were
		// stored without the machine's directories.
		relativeSources(cal, wd)
	}
	if err := cal.Validate(); err != nil {
		return fmt.Errorf("model calibrate: the fit is refused, nothing written: %w%s", err, floorEvidence(cal))
	}
	for _, w := range cal.Warnings() {
		if _, err := fmt.Fprintf(stderr, "model calibrate: warning: %s\n", w); err != nil {
			return err
		}
	}
	for _, n := range cal.AtLineRate() {
		if _, err := fmt.Fprintf(stderr, "model calibrate: %s\n", n); err != nil {
			return err
		}
	}
	body, err := json.MarshalIndent(cal, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(f.out, append(body, '\n'), 0o644); err != nil {
		return fmt.Errorf("model calibrate: %w", err)
	}
	for _, fit := range cal.Fits {
		kind := fit.Kind
		if fit.Model != "" {
			kind = fit.Model + " " + kind
		}
		if _, err := fmt.Fprintf(stdout, "%-7s efficiency %.3f from %d measurements (measured/predicted before: %.3f)\n",
			kind, fit.Efficiency, fit.Samples, fit.Ratio); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(stdout, "wrote %s\n", f.out)
	return err
}

// sourceName is how a set names a measurement file: its path relative to
// the working directory wd where the file lies under it (runs/node3/ar.txt
// tells two runs apart), else its base name; never an absolute path, which
// would show the directories of the machine that ran calibrate (user
// names, mounts) to everyone who reads the calibration bucket. wd "" (not
// known): the base name.
func sourceName(file, wd string) string {
	base := filepath.Base(file)
	if wd == "" || !filepath.IsAbs(wd) {
		return base
	}
	if !filepath.IsAbs(file) {
		file = filepath.Join(wd, file)
	}
	rel, err := filepath.Rel(wd, filepath.Clean(file))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
		return base
	}
	return filepath.ToSlash(rel)
}

// relativeSources names every absolute source of c (file:line) as
// sourceName does.
func relativeSources(c *collective.Calibration, wd string) {
	fix := func(srcs []string) {
		for i, s := range srcs {
			if !strings.HasPrefix(s, "/") && !filepath.IsAbs(s) {
				continue
			}
			file, line := s, ""
			if j := strings.LastIndexByte(s, ':'); j > 0 {
				file, line = s[:j], s[j:]
			}
			srcs[i] = sourceName(file, wd) + line
		}
	}
	for i := range c.Fits {
		fix(c.Fits[i].Sources)
	}
	if c.Latency != nil {
		fix(c.Latency.Sources)
	}
	for i := range c.ModelLatency {
		fix(c.ModelLatency[i].Sources)
	}
}

// floorEvidence names the measurements of each fit below its floor: the
// files to look at.
func floorEvidence(c *collective.Calibration) string {
	var b strings.Builder
	for _, f := range c.Fits {
		if f.Efficiency >= collective.EfficiencyFloors[f.Kind] {
			continue
		}
		kind := f.Kind
		if f.Model != "" {
			kind = f.Model + " " + kind
		}
		fmt.Fprintf(&b, "; %s fitted to %.3g from %d measurements (%.3g of the default's prediction): %s", kind, f.Efficiency, f.Samples, f.Ratio,
			strings.Join(f.Sources[:min(len(f.Sources), 4)], ", "))
		if len(f.Sources) > 4 {
			b.WriteString(", ...")
		}
	}
	return b.String()
}

// fileSamples are the samples of one file's tests on placement p: each
// test's collective is the flag's, else the one its log or the file's
// name names. A test of a collective the model has no cost for
// (broadcast, reduce) or of one rank (no communication) is skipped, and
// so is a row whose data check found wrong elements, each with a note on
// stderr; a test of another rank count than p's is refused.
func fileSamples(stderr io.Writer, res nccltests.Result, flag string, algo collective.Algorithm, p collective.Placement, source string) ([]collective.Sample, error) {
	var out []collective.Sample
	usable := 0
	for _, t := range res.Tests {
		name := t.Collective
		if flag != "" {
			name = flag
		}
		if name == "" {
			return nil, fmt.Errorf("%s:%d: neither the log nor the file's name names the collective (all_reduce, all_gather, reduce_scatter, sendrecv): give --collective", res.File, t.Line)
		}
		c, err := collective.ParseCollective(name)
		if err != nil {
			if flag != "" {
				return nil, err
			}
			if _, err := fmt.Fprintf(stderr, "model calibrate: %s:%d: %s: not a collective the model predicts, skipped\n", res.File, t.Line, name); err != nil {
				return nil, err
			}
			continue
		}
		switch {
		case t.Ranks == 1:
			if _, err := fmt.Fprintf(stderr, "model calibrate: %s:%d: %s on 1 rank moves nothing between GPUs, skipped\n", res.File, t.Line, name); err != nil {
				return nil, err
			}
			continue
		case t.Ranks > 0 && t.Ranks != len(p.Ranks):
			return nil, fmt.Errorf("%s:%d: %s ran on %d ranks (its \"# Using devices\" lines), the topology gives %d (--nodes × its GPUs): a measurement of another placement",
				res.File, t.Line, name, t.Ranks, len(p.Ranks))
		}
		usable++
		for _, r := range t.Rows {
			if t.WrongColumn == "#wrong" && (r.WrongOut > 0 || r.WrongIn > 0) {
				if _, err := fmt.Fprintf(stderr, "model calibrate: warning: %s:%d: %g / %g wrong elements: the data check failed, row skipped\n", res.File, r.Line, r.WrongOut, r.WrongIn); err != nil {
					return nil, err
				}
				continue
			}
			if r.BusBW() <= 0 {
				continue // too small to show (and the rows of size 0)
			}
			out = append(out, collective.Sample{Placement: p, Collective: c, Algorithm: algo, Bytes: r.Bytes,
				BusBWGBps: r.BusBW(), Source: fmt.Sprintf("%s:%d", source, r.Line)})
		}
	}
	if usable == 0 {
		return nil, fmt.Errorf("%s: no test of a collective the model predicts (all_reduce, all_gather, reduce_scatter, sendrecv, alltoall) on more than one rank", res.File)
	}
	return out, nil
}

// loadCalibration reads a calibration set.
func loadCalibration(file string) (*collective.Calibration, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return collective.ParseCalibration(file, data)
}
