package quality

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/fixtures"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/formats/fabric"
	"github.com/toposched/toposched/internal/placer/aware"
	"github.com/toposched/toposched/internal/placer/blind"
	"github.com/toposched/toposched/internal/placer/engine"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/internal/topology"
)

// Config says what Run measures.
type Config struct {
	// Topologies is the directory of node topology files ("": the
	// project's copies, found from the repository root or below it).
	Topologies string
	// Fabrics is the fabric directory ("": the project's copy).
	Fabrics string
	Seed    uint64
	// Quick runs a small subset of both tables.
	Quick bool
	// Evals bounds the local search per placement (<= 0: none).
	Evals int
	// FamilyCases is how many generated single-node cases table (c) scores
	// (0: DefaultFamilyCases; Quick: 200).
	FamilyCases int
	// Tables names the tables to print, by letter ("": all four, "abcd").
	Tables string
	// Misses lists the cases of table (d) not within 2% of the optimum.
	Misses bool
}

// DefaultFamilyCases is table (c)'s default size.
const DefaultFamilyCases = 10_000

type qualityFlags struct {
	topologies, fabrics string
	seed                uint64
	quick               bool
	evals               int
	familyCases         int
	misses              bool
}

// Run prints the quality tables (see toposched quality --help).
func Run(out io.Writer, cfg Config) error {
	f := qualityFlags{topologies: cfg.Topologies, fabrics: cfg.Fabrics, seed: cfg.Seed, quick: cfg.Quick, evals: cfg.Evals,
		familyCases: cfg.FamilyCases, misses: cfg.Misses}
	start := time.Now()
	opts := engine.Options{Budget: -1, MaxEvals: f.evals} // bounded by evaluations: not the machine's speed
	if f.evals <= 0 {
		opts.MaxEvals = -1
	}
	tables := []func(io.Writer, qualityFlags, engine.Options) error{qualityNodes, qualityClusters, qualityFamilies, qualityClusterFamilies}
	which := cfg.Tables
	if which == "" {
		which = "abcd"
	}
	for _, r := range which {
		if r < 'a' || int(r-'a') >= len(tables) {
			return fmt.Errorf("quality: no table %q (tables: a, b, c, d)", r)
		}
	}
	printed := 0
	for i, table := range tables {
		if !strings.ContainsRune(which, rune('a'+i)) {
			continue
		}
		printed++
		if printed > 1 {
			if _, err := fmt.Fprintln(out); err != nil {
				return err
			}
		}
		if err := table(out, f, opts); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(out, "\nquality run took %s\n", time.Since(start).Round(time.Millisecond))
	return err
}

// findDir returns rel if it is a directory, else rel seen from up to
// three directories above (a test runs in its package's directory), else "".
func findDir(rel string) string {
	for _, up := range []string{"", "../", "../../", "../../../"} {
		p := filepath.Clean(up + rel)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
	}
	return ""
}

// topologyFiles lists the complete topology files to measure.
func topologyFiles(dir string) ([]string, string, error) {
	dirs := []string{dir}
	src := dir
	if dir == "" {
		dirs = []string{findDir("internal/formats/nvsmi/testdata"), findDir("internal/formats/ncclxml/testdata")}
		if dirs[0] == "" || dirs[1] == "" {
			return nil, "", fmt.Errorf("quality: no topology directory found; give --topologies")
		}
		src = strings.Join(dirs, ", ")
	}
	var files []string
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() {
				if e.Name() == "golden" {
					return filepath.SkipDir
				}
				return nil
			}
			name := e.Name()
			if strings.Contains(name, ".partial.") || (!strings.HasSuffix(name, ".txt") && !strings.HasSuffix(name, ".xml")) {
				return nil
			}
			files = append(files, p)
			return nil
		})
		if err != nil {
			return nil, "", fmt.Errorf("quality: %w", err)
		}
	}
	slices.SortFunc(files, func(a, b string) int { return strings.Compare(filepath.Base(a), filepath.Base(b)) })
	return files, src, nil
}

type nodeCase struct {
	file, pattern string
	ev            events.TopologyNode
	held          []int
	n, tp         int
	// results
	ours, best, blind float64
	refused           string
	err               error
}

func qualityNodes(stdout io.Writer, f qualityFlags, opts engine.Options) error {
	files, src, err := topologyFiles(f.topologies)
	if err != nil {
		return err
	}
	out := textout.New(stdout)
	out.Printf("(a) single nodes: topology-aware vs exhaustive optimum vs blind first fit\ntopologies: %s\n\n", src)
	var cases []*nodeCase
	for fi, file := range files {
		ev, err := clusterfile.LoadNodeFile(file, clusterfile.NodeFileOptions{})
		if err != nil {
			out.Printf("skipped %s: %v\n", filepath.Base(file), err)
			continue
		}
		if f.quick && fi >= 3 {
			break
		}
		g := len(ev.GPUs)
		if g < 2 {
			continue
		}
		type pattern struct {
			name string
			held []int
		}
		pats := []pattern{{name: "empty"}}
		if !f.quick {
			for k := range 2 {
				rng := rand.New(rand.NewPCG(f.seed, uint64(fi*16+k)))
				var held []int
				for _, p := range rng.Perm(g)[:max(1, g/4+rng.IntN(g/4+1))] {
					held = append(held, ev.GPUs[p].Index)
				}
				slices.Sort(held)
				pats = append(pats, pattern{fmt.Sprintf("held %v", held), held})
			}
		}
		for _, p := range pats {
			free := g - len(p.held)
			maxN := free
			if f.quick {
				maxN = min(free, 4)
			}
			for n := 2; n <= maxN; n++ {
				for _, tp := range []int{1, 2, 4} {
					if tp > 1 && (n%tp != 0 || n/tp < 2 || f.quick) {
						continue
					}
					cases = append(cases, &nodeCase{file: filepath.Base(file), pattern: p.name, ev: ev, held: p.held, n: n, tp: tp})
				}
			}
		}
	}
	if err := out.Err(); err != nil {
		return err
	}
	parallel(len(cases), func(i int) { cases[i].run(opts) })

	tw := textout.Table(out, 0, 0, 2, ' ', 0)
	tw.Println("topology\toccupancy\tgpus\tjob\toptimum\tours\tblind\tours/opt\tblind/opt")
	within, total, refused := 0, 0, 0
	var worst float64
	for _, c := range cases {
		job := "dp"
		if c.tp > 1 {
			job = fmt.Sprintf("tp%dxdp%d", c.tp, c.n/c.tp)
		}
		switch {
		case c.err != nil:
			tw.Printf("%s\t%s\t%d\t%s\terror: %v\n", short(c.file), c.pattern, c.n, job, c.err)
			continue
		case c.refused != "":
			refused++
			tw.Printf("%s\t%s\t%d\t%s\t(refused)\t%s\t%s\t\t\n", short(c.file), c.pattern, c.n, job, fmtMS(c.ours), fmtMS(c.blind))
			continue
		}
		total++
		r := ratio(c.ours, c.best)
		if r <= 1.02 {
			within++
		}
		worst = max(worst, r)
		tw.Printf("%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.3f\t%.3f\n", short(c.file), c.pattern, c.n, job,
			fmtMS(c.best), fmtMS(c.ours), fmtMS(c.blind), r, ratio(c.blind, c.best))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	share := 0.0
	if total > 0 {
		share = float64(within) / float64(total)
	}
	out.Printf("\nwithin 2%% of the optimum: %d of %d cases (%.1f%%; target >= 95%%: %s); worst ours/optimum %.3f; %d cases too big for exhaustive\n",
		within, total, 100*share, held(share >= 0.95), worst, refused)
	return out.Err()
}

func held(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func short(file string) string {
	if i := strings.IndexByte(file, '_'); i > 0 {
		return file[:i]
	}
	return file
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		if a <= 0 {
			return 1
		}
		return math.Inf(1)
	}
	return a / b
}

func fmtMS(s float64) string { return fmt.Sprintf("%.3f ms", 1e3*s) }

func (c *nodeCase) run(opts engine.Options) {
	st, err := fixtures.NewStore([]fixtures.Node{{Event: c.ev, Name: "node", Held: c.held, HeldBy: "other"}}, nil)
	if err != nil {
		c.err = err
		return
	}
	snap := st.Snapshot()
	job := fixtures.SyntheticJob("q", c.n, c.tp, 1)
	score := func(r outcome.Result) float64 {
		if r.Verdict != outcome.Placed {
			c.err = fmt.Errorf("%v: %v", r.Verdict, r.Reasons)
			return math.NaN()
		}
		p, err := aware.Predict(snap, job, r.GPUs, nil)
		if err != nil {
			c.err = err
		}
		return p.CommSeconds
	}
	c.ours = score(aware.Place(engine.Request{Snap: snap, Job: job, Options: opts}))
	c.blind = score(blind.Place(snap, job))
	ex, err := aware.Exhaustive(engine.Request{Snap: snap, Job: job, Options: opts})
	if err != nil {
		c.refused = err.Error()
		return
	}
	c.best = score(ex)
}

// parallel runs fn(0..n-1) on GOMAXPROCS workers.
func parallel(n int, fn func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fn(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// clusterSpec is one fabric with its node model.
type clusterSpec struct {
	name, file, model string
	slurm             bool
}

type clusterCase struct {
	cl                         *builtCluster
	occ                        float64
	trial                      int
	kind                       string
	n                          int
	ours, blind, random, ideal float64
	skipped                    string
	err                        error
}

type builtCluster struct {
	spec   clusterSpec
	nodes  []string
	fab    *topology.Fabric
	fabEv  events.TopologyFabric
	nodeEv events.TopologyNode
}

func jobOf(kind string, n int) events.JobAnalyzed {
	switch kind {
	case "tp8xdp":
		return fixtures.SyntheticJob("q", n, 8, 1)
	case "tp8xppxdp":
		pp := 4
		if n < 64 {
			pp = 2
		}
		return fixtures.SyntheticJob("q", n, 8, pp)
	}
	return fixtures.SyntheticJob("q", n, 1, 1)
}

func jobName(kind string, n int) string {
	j := jobOf(kind, n)
	p := j.Parallelism
	switch kind {
	case "tp8xdp":
		return fmt.Sprintf("tp8 x dp%d", p.DP)
	case "tp8xppxdp":
		return fmt.Sprintf("tp8 x pp%d x dp%d", p.PP, p.DP)
	}
	return fmt.Sprintf("dp%d", n)
}

func qualityClusters(stdout io.Writer, f qualityFlags, opts engine.Options) error {
	dir := f.fabrics
	if dir == "" {
		dir = findDir("internal/formats/fabric/testdata")
		if dir == "" {
			return fmt.Errorf("quality: no fabric directory found; give --fabrics")
		}
	}
	specs := []clusterSpec{
		{name: "lingjun", file: "lingjun/topo.csv", model: "dgx-a100"},
		{name: "slurm-circe", file: "slurm/nvidia-circe-dgx2-superpod_slurm-superpod-topology.conf.txt", model: "dgx-h100", slurm: true},
	}
	occs := []float64{0.3, 0.5, 0.7}
	sizes := []int{16, 32, 64, 128, 256, 512}
	kinds := []string{"dp", "tp8xdp", "tp8xppxdp"}
	trials := 2
	if f.quick {
		specs, occs, sizes, trials = specs[1:], []float64{0.5}, []int{16, 32}, 1
	}
	out := textout.New(stdout)
	out.Printf("(b) fragmented clusters: topology-aware vs blind vs random vs ideal bound\nfabrics: %s\n\n", dir)
	if err := out.Err(); err != nil {
		return err
	}
	var cases []*clusterCase
	for _, s := range specs {
		cl, err := buildCluster(dir, s)
		if err != nil {
			return fmt.Errorf("quality: %w", err)
		}
		for _, occ := range occs {
			for t := range trials {
				for _, k := range kinds {
					for _, n := range sizes {
						cases = append(cases, &clusterCase{cl: cl, occ: occ, trial: t, kind: k, n: n})
					}
				}
			}
		}
	}
	ideal := newIdeal(opts)
	parallel(len(cases), func(i int) { cases[i].run(f.seed, opts, ideal) })

	tw := textout.Table(out, 0, 0, 2, ' ', 0)
	tw.Println("fabric\toccupancy\ttrial\tjob\tgpus\tblind\trandom\tours\tideal\tours vs blind")
	var all []float64
	byKind := map[string][]float64{}
	byOcc := map[float64][]float64{}
	for _, c := range cases {
		prefix := fmt.Sprintf("%s\t%.0f%%\t%d\t%s\t%d", c.cl.spec.name, 100*c.occ, c.trial, jobName(c.kind, c.n), c.n)
		switch {
		case c.err != nil:
			tw.Printf("%s\terror: %v\n", prefix, c.err)
			continue
		case c.skipped != "":
			tw.Printf("%s\t(%s)\n", prefix, c.skipped)
			continue
		}
		red := 1 - ratio(c.ours, c.blind)
		all = append(all, red)
		byKind[c.kind] = append(byKind[c.kind], red)
		byOcc[c.occ] = append(byOcc[c.occ], red)
		tw.Printf("%s\t%s\t%s\t%s\t%s\t%+.1f%%\n", prefix, fmtMS(c.blind), fmtMS(c.random), fmtMS(c.ours), fmtMS(c.ideal), -100*red)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	out.Println()
	for _, k := range kinds {
		out.Printf("median reduction vs blind, %-10s %5.1f%% (%d cases)\n", k+":", 100*median(byKind[k]), len(byKind[k]))
	}
	for _, o := range occs {
		out.Printf("median reduction vs blind, %3.0f%% occupied: %5.1f%% (%d cases)\n", 100*o, 100*median(byOcc[o]), len(byOcc[o]))
	}
	m := median(all)
	out.Printf("median reduction of predicted comm time per step vs blind: %.1f%% over %d cases (target >= 25%%: %s)\n", 100*m, len(all), held(m >= 0.25))
	return out.Err()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func buildCluster(dir string, s clusterSpec) (*builtCluster, error) {
	path := filepath.Join(dir, s.file)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var fe events.TopologyFabric
	if s.slurm {
		fe, err = fabric.ParseSlurm(filepath.Base(path), data)
	} else {
		fe, err = fabric.ParseClosCSV(filepath.Base(path), data)
	}
	if err != nil {
		return nil, err
	}
	fab, err := topology.NewFabric(fe)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var nodes []string
	for _, sw := range fe.Switches {
		for _, n := range sw.Nodes {
			if !seen[n] {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	t, err := clusterfile.Model(s.model)
	if err != nil {
		return nil, err
	}
	return &builtCluster{spec: s, nodes: nodes, fab: fab, fabEv: fe, nodeEv: t.Event()}, nil
}

// store builds the cluster with each GPU held with probability occ.
func (b *builtCluster) store(occ float64, rng *rand.Rand) (*store.Store, error) {
	nodes := make([]fixtures.Node, len(b.nodes))
	for i, name := range b.nodes {
		nodes[i] = fixtures.Node{Event: b.nodeEv, Name: name, HeldBy: "bg-" + name}
		for _, g := range b.nodeEv.GPUs {
			if rng.Float64() < occ {
				nodes[i].Held = append(nodes[i].Held, g.Index)
			}
		}
	}
	return fixtures.NewStore(nodes, b.fab)
}

func (c *clusterCase) run(seed uint64, opts engine.Options, ideal *idealCache) {
	rng := rand.New(rand.NewPCG(seed, uint64(1000*c.occ)*131+uint64(c.trial)*7+uint64(len(c.cl.nodes))))
	st, err := c.cl.store(c.occ, rng)
	if err != nil {
		c.err = err
		return
	}
	snap := st.Snapshot()
	job := jobOf(c.kind, c.n)
	if free := snap.FreeCount(); free < c.n {
		c.skipped = fmt.Sprintf("%d free GPUs", free)
		return
	}
	o := opts
	o.Fabric = c.cl.fab
	score := func(gpus []store.GPUKey) float64 {
		p, err := aware.Predict(snap, job, gpus, c.cl.fab)
		if err != nil {
			c.err = err
		}
		return p.CommSeconds
	}
	r := aware.Place(engine.Request{Snap: snap, Job: job, Options: o})
	if r.Verdict != outcome.Placed {
		c.err = fmt.Errorf("ours: %v %v", r.Verdict, r.Reasons)
		return
	}
	c.ours = score(r.GPUs)
	b := blind.Place(snap, job)
	if b.Verdict != outcome.Placed {
		c.err = fmt.Errorf("blind: %v %v", b.Verdict, b.Reasons)
		return
	}
	c.blind = score(b.GPUs)
	// Random: n of the free GPUs, in random order (same seed per case).
	var free []store.GPUKey
	for _, g := range snap.FreeGPUsOfModel("") {
		free = append(free, g.Key())
	}
	slices.SortFunc(free, func(a, b store.GPUKey) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index))
	})
	rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	c.random = score(free[:c.n])
	c.ideal, err = ideal.get(c.cl, c.kind, c.n)
	if err != nil {
		c.err = err
	}
}

// idealCache computes the ideal bound once per node model, job and size.
type idealCache struct {
	opts engine.Options
	mu   sync.Mutex
	vals map[string]float64
}

func newIdeal(opts engine.Options) *idealCache {
	return &idealCache{opts: opts, vals: map[string]float64{}}
}

func (ic *idealCache) get(b *builtCluster, kind string, n int) (float64, error) {
	key := fmt.Sprintf("%s/%s/%d", b.spec.model, kind, n)
	ic.mu.Lock()
	v, ok := ic.vals[key]
	ic.mu.Unlock()
	if ok {
		return v, nil
	}
	nodes := make([]fixtures.Node, (n+7)/8)
	for i := range nodes {
		nodes[i] = fixtures.Node{Event: b.nodeEv, Name: fmt.Sprintf("ideal%03d", i)}
	}
	st, err := fixtures.NewStore(nodes, nil)
	if err != nil {
		return 0, err
	}
	snap := st.Snapshot()
	job := jobOf(kind, n)
	r := aware.Place(engine.Request{Snap: snap, Job: job, Options: ic.opts})
	if r.Verdict != outcome.Placed {
		return 0, fmt.Errorf("ideal: %v %v", r.Verdict, r.Reasons)
	}
	p, err := aware.Predict(snap, job, r.GPUs, nil)
	if err != nil {
		return 0, err
	}
	ic.mu.Lock()
	ic.vals[key] = p.CommSeconds
	ic.mu.Unlock()
	return p.CommSeconds, nil
}

// familyExhaustiveLimit bounds the exhaustive optimum of one case of table
// (c): its orders of k of the free GPUs (7 of 8 is 40,320).
const familyExhaustiveLimit = 40_320

// familyCase is one generated single-node case.
type familyCase struct {
	family string
	ev     events.TopologyNode
	held   []int
	n, tp  int
	small  bool // free!/(free-k)! within the exact in-node choice's budget
	ratio  float64
	opt    []store.GPUKey
	ours   []store.GPUKey
	err    error
}

// qualityFamilies is table (c): seeded generated nodes of each family
// (fixtures.Families) with random occupancy and random tp/dp jobs,
// topology-aware against the exhaustive optimum, by family, split by
// whether the exact in-node choice's budget covers the case.
func qualityFamilies(stdout io.Writer, f qualityFlags, opts engine.Options) error {
	want := f.familyCases
	switch {
	case f.quick:
		want = 200
	case want <= 0:
		want = DefaultFamilyCases
	}
	out := textout.New(stdout)
	out.Printf("(c) generated nodes: topology-aware vs exhaustive optimum, by family (%d seeded cases)\n\n", want)
	rng := rand.New(rand.NewPCG(f.seed, 14))
	var cases []*familyCase
	for i := 0; len(cases) < want; i++ {
		fam := fixtures.Families[i%len(fixtures.Families)]
		ev := fam.Node(rng, "node")
		g := len(ev.GPUs)
		held := rng.Perm(g)[:rng.IntN(g-1)]
		free := g - len(held)
		if free < 2 {
			continue
		}
		n := 2 + rng.IntN(free-1)
		tp := []int{1, 2, 4}[rng.IntN(3)]
		if n%tp != 0 {
			tp = 1
		}
		if aware.ExhaustiveCount(free, n) > familyExhaustiveLimit {
			continue
		}
		cases = append(cases, &familyCase{family: fam.Name, ev: ev, held: held, n: n, tp: tp,
			small: aware.ExhaustiveCount(free, n) <= aware.DefaultNodeExact})
	}
	if err := out.Err(); err != nil {
		return err
	}
	parallel(len(cases), func(i int) { cases[i].run(opts) })
	type row struct {
		cases, within05, within2 int
		worst                    float64
	}
	rows := map[string]*row{}
	var keys []string
	for _, c := range cases {
		if c.err != nil {
			return fmt.Errorf("quality: %s: %w", c.family, c.err)
		}
		k := c.family + fmt.Sprintf("\t<= %d", aware.DefaultNodeExact)
		if !c.small {
			k = c.family + fmt.Sprintf("\t> %d", aware.DefaultNodeExact)
		}
		r := rows[k]
		if r == nil {
			r = &row{}
			rows[k] = r
			keys = append(keys, k)
		}
		r.cases++
		if c.ratio <= 1.005 {
			r.within05++
		}
		if c.ratio <= 1.02 {
			r.within2++
		}
		r.worst = max(r.worst, c.ratio)
	}
	slices.Sort(keys)
	tw := textout.Table(out, 0, 0, 2, ' ', 0)
	tw.Println("family\torders\tcases\twithin 0.5%\twithin 2%\tworst ours/opt")
	var all, within int
	for _, k := range keys {
		r := rows[k]
		tw.Printf("%s\t%d\t%d\t%d\t%.3f\n", k, r.cases, r.within05, r.within2, r.worst)
		all += r.cases
		within += r.within05
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	out.Printf("\n%d of %d cases within 0.5%% of the optimum (target: all: %s). orders: free!/(free-k)!, the choices of k of the free GPUs in every order; the exact in-node choice scores those that differ (twins, interchangeable GPUs, once; or one order per class of ranks the cost cannot tell apart) within a budget of %d, the heuristic the rest; cases up to %d orders, where exhaustive still runs\n",
		within, all, held(within == all), aware.DefaultNodeExact, familyExhaustiveLimit)
	if f.misses {
		out.Printf("\nmisses (node: GPUs, links, GPUs per socket, free GPUs; GPUs in rank order):\n")
		for i, c := range cases {
			if c.ratio <= 1.005 {
				continue
			}
			out.Printf("case %d %s %s ours/opt %.3f\n  node: %s\n  ours %s\n  opt  %s\n", i, c.family, shapeName(c.n, c.tp), c.ratio,
				describeNode(fixtures.Node{Event: c.ev, Name: "node", Held: c.held}), fmtGPUs(c.ours), fmtGPUs(c.opt))
		}
	}
	return out.Err()
}

func (c *familyCase) run(opts engine.Options) {
	c.ratio, c.opt, c.ours, c.err = againstOptimum([]fixtures.Node{{Event: c.ev, Name: "node", Held: c.held, HeldBy: "other"}}, c.n, c.tp, opts)
}

// againstOptimum places a synthetic job of n GPUs (tp) on the nodes with
// topology-aware and exhaustively, and returns the ratio of their
// predicted comm times, the optimum's GPUs and ours.
func againstOptimum(nodes []fixtures.Node, n, tp int, opts engine.Options) (float64, []store.GPUKey, []store.GPUKey, error) {
	st, err := fixtures.NewStore(nodes, nil)
	if err != nil {
		return 0, nil, nil, err
	}
	snap := st.Snapshot()
	job := fixtures.SyntheticJob("q", n, tp, 1)
	ours := aware.Place(engine.Request{Snap: snap, Job: job, Options: opts})
	ex, err := aware.Exhaustive(engine.Request{Snap: snap, Job: job, Options: engine.Options{}})
	if err != nil {
		return 0, nil, nil, err
	}
	if ours.Verdict != outcome.Placed || ex.Verdict != outcome.Placed {
		return 0, nil, nil, fmt.Errorf("%d GPUs: ours %v, exhaustive %v", n, ours.Verdict, ex.Verdict)
	}
	a, err1 := aware.Predict(snap, job, ours.GPUs, nil)
	b, err2 := aware.Predict(snap, job, ex.GPUs, nil)
	if err := errors.Join(err1, err2); err != nil {
		return 0, nil, nil, err
	}
	return ratio(a.CommSeconds, b.CommSeconds), ex.GPUs, ours.GPUs, nil
}

// clusterFamilyCase is one generated small cluster of one family.
type clusterFamilyCase struct {
	family string
	nodes  []fixtures.Node
	n, tp  int
	multi  bool // the optimum spans nodes
	ratio  float64
	opt    []store.GPUKey
	ours   []store.GPUKey
	err    error
}

// clusterFamilyCases is table (d)'s size (Quick: 100).
const clusterFamilyCases = 1_000

// qualityClusterFamilies is table (d): seeded clusters of two or three
// generated nodes of one family, each half to fully occupied at random,
// and jobs of 2 to 6 GPUs (tp 1 or 2), topology-aware against the
// exhaustive optimum over the whole cluster, by family and by whether
// the optimum spans nodes.
func qualityClusterFamilies(stdout io.Writer, f qualityFlags, opts engine.Options) error {
	want := clusterFamilyCases
	if f.quick {
		want = 100
	}
	out := textout.New(stdout)
	out.Printf("(d) generated small clusters: topology-aware vs exhaustive optimum, by family (%d seeded cases)\n\n", want)
	rng := rand.New(rand.NewPCG(f.seed, 15))
	var cases []*clusterFamilyCase
	for i := 0; len(cases) < want; i++ {
		fam := fixtures.Families[i%len(fixtures.Families)]
		c := &clusterFamilyCase{family: fam.Name}
		free := 0
		for j := range 2 + rng.IntN(2) {
			name := fmt.Sprintf("n%d", j)
			ev := fam.Node(rng, name)
			g := len(ev.GPUs)
			held := rng.Perm(g)[:g/2+rng.IntN(g/2)]
			free += g - len(held)
			c.nodes = append(c.nodes, fixtures.Node{Event: ev, Name: name, Held: held})
		}
		c.n = 2 + rng.IntN(5)
		c.tp = []int{1, 2}[rng.IntN(2)]
		if c.n%c.tp != 0 {
			c.tp = 1
		}
		if c.n > free || aware.ExhaustiveCount(free, c.n) > familyExhaustiveLimit {
			continue
		}
		cases = append(cases, c)
	}
	if err := out.Err(); err != nil {
		return err
	}
	parallel(len(cases), func(i int) { cases[i].run(opts) })
	type row struct {
		cases, within2 int
		worst          float64
	}
	rows := map[string]*row{}
	var keys []string
	within, all := 0, 0
	for _, c := range cases {
		if c.err != nil {
			return fmt.Errorf("quality: %s: %w", c.family, c.err)
		}
		k := c.family + "\tone node"
		if c.multi {
			k = c.family + "\tnodes"
		}
		r := rows[k]
		if r == nil {
			r = &row{}
			rows[k] = r
			keys = append(keys, k)
		}
		r.cases++
		all++
		if c.ratio <= 1.02 {
			r.within2++
			within++
		}
		r.worst = max(r.worst, c.ratio)
	}
	slices.Sort(keys)
	tw := textout.Table(out, 0, 0, 2, ' ', 0)
	tw.Println("family\toptimum on\tcases\twithin 2%\tworst ours/opt")
	for _, k := range keys {
		r := rows[k]
		tw.Printf("%s\t%d\t%d\t%.3f\n", k, r.cases, r.within2, r.worst)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	share := float64(within) / float64(max(all, 1))
	out.Printf("\n%d of %d cases within 2%% of the optimum (%.1f%%; target >= 98%%: %s)\n", within, all, 100*share, held(share >= 0.98))
	if f.misses {
		out.Printf("\nmisses (nodes: GPUs, links, GPUs per socket, free GPUs; GPUs in rank order):\n")
		for i, c := range cases {
			if c.ratio <= 1.02 {
				continue
			}
			out.Printf("case %d %s %s ours/opt %.3f\n", i, c.family, shapeName(c.n, c.tp), c.ratio)
			for _, nd := range c.nodes {
				out.Printf("  %s: %s\n", nd.Name, describeNode(nd))
			}
			out.Printf("  ours %s\n  opt  %s\n", fmtGPUs(c.ours), fmtGPUs(c.opt))
		}
	}
	return out.Err()
}

// shapeName is a synthetic job's shape: dpN or tpTxdpD.
func shapeName(n, tp int) string {
	if tp > 1 {
		return fmt.Sprintf("tp%dxdp%d", tp, n/tp)
	}
	return fmt.Sprintf("dp%d", n)
}

// describeNode summarises a generated node: its GPUs, link classes, the
// GPUs GPU 0 reaches without crossing sockets (SYS), and its free GPUs.
func describeNode(nd fixtures.Node) string {
	ev := nd.Event
	var links []string
	for i, row := range ev.GPUPaths {
		for j, l := range row {
			if i != j && !slices.Contains(links, l) {
				links = append(links, l)
			}
		}
	}
	slices.Sort(links)
	socket := 0
	if len(ev.GPUPaths) > 0 {
		for _, l := range ev.GPUPaths[0] {
			if l != "SYS" {
				socket++
			}
		}
	}
	var free []int
	for _, g := range ev.GPUs {
		if !slices.Contains(nd.Held, g.Index) {
			free = append(free, g.Index)
		}
	}
	return fmt.Sprintf("%d GPUs %s, %d/socket, free %v", len(ev.GPUs), strings.Join(links, "/"), socket, free)
}

func fmtGPUs(gpus []store.GPUKey) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = fmt.Sprintf("%s/%d", g.Node, g.Index)
	}
	return strings.Join(parts, " ")
}

func (c *clusterFamilyCase) run(opts engine.Options) {
	c.ratio, c.opt, c.ours, c.err = againstOptimum(c.nodes, c.n, c.tp, opts)
	for _, g := range c.opt {
		if g.Node != c.opt[0].Node {
			c.multi = true
		}
	}
}
