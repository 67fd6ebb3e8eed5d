package launch

import (
	"fmt"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/placer/outcome"
	"github.com/toposched/toposched/internal/store"
)

func storeWith(t *testing.T, nodes ...events.TopologyNode) *store.Store {
	t.Helper()
	s, err := store.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := s.UpsertNode(n); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func dgx(t *testing.T, name string) events.TopologyNode {
	t.Helper()
	n, err := clusterfile.Model("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	ev := n.Event()
	ev.Name = name
	// As NVML would report them: NCCL's XML needs bus ids.
	for i := range ev.GPUs {
		ev.GPUs[i].UUID = "GPU-" + name + "-" + string(rune('0'+i))
		ev.GPUs[i].BusID = fmt.Sprintf("0000:%02x:00.0", 0x07+0x10*i)
	}
	for k := range ev.NICs {
		ev.NICs[k].BusID = fmt.Sprintf("0000:%02x:00.0", 0x0c+0x10*k)
	}
	return ev
}

func TestFillBlocks(t *testing.T) {
	t.Parallel()
	s := storeWith(t, dgx(t, "a"), dgx(t, "b"))
	var gpus []store.GPUKey
	for _, n := range []string{"a", "b"} {
		for g := range 2 {
			gpus = append(gpus, store.GPUKey{Node: n, Index: 2 + g})
		}
	}
	d := outcome.Decide("j", gpus, "blind")
	Fill(&d, s.Snapshot())
	r := d.Ranks[3]
	if r.UUID != "GPU-b-3" || r.NUMA == nil || *r.NUMA != 1 || r.NIC != "mlx5_3" {
		t.Errorf("rank 3: %+v", r)
	}
	// Rank 0 is on a's GPU 2.
	if got := strings.Join(d.Nodes[1].Torchrun, " "); got != "--nnodes=2 --node_rank=1 --nproc_per_node=2 --master_addr=a --master_port=29502" {
		t.Errorf("torchrun: %s", got)
	}
	if d.Launch.MasterPort != 29502 {
		t.Errorf("master port %d, want 29502", d.Launch.MasterPort)
	}
	if d.Nodes[0].SlurmGPUBind != "map_gpu:2,3" || d.Launch.SlurmNodelist != "a,b" || d.Launch.MasterAddr != "a" {
		t.Errorf("slurm: %q %+v", d.Nodes[0].SlurmGPUBind, d.Launch)
	}
	if !strings.Contains(d.Launch.MPIRankfile, "rank 2=b slot=0\n") {
		t.Errorf("rankfile:\n%s", d.Launch.MPIRankfile)
	}
	if x := d.Nodes[0].NCCLTopoXML; !strings.Contains(x, "<system") || strings.Count(x, "<gpu ") != 2 {
		t.Errorf("NCCL XML:\n%s", x)
	}
}

// A node described without bus ids (a built-in model, nvidia-smi output)
// gets no NCCL XML: NCCL matches GPUs by bus id.
func TestFillNoBusIDs(t *testing.T) {
	t.Parallel()
	n, err := clusterfile.Model("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	ev := n.Event()
	ev.Name = "m"
	s := storeWith(t, ev)
	d := outcome.Decide("j", []store.GPUKey{{Node: "m", Index: 0}}, "blind")
	Fill(&d, s.Snapshot())
	if d.Nodes[0].NCCLTopoXML != "" || d.Ranks[0].NIC != "mlx5_0" {
		t.Errorf("%+v %+v", d.Nodes[0], d.Ranks[0])
	}
}

// Ranks that torchrun cannot number (not node by node) get no torchrun
// arguments; the rankfile still places each rank.
func TestFillInterleaved(t *testing.T) {
	t.Parallel()
	s := storeWith(t, events.TopologyNode{Name: "a", GPUs: []events.GPU{{Index: 0}, {Index: 1}}},
		events.TopologyNode{Name: "b", GPUs: []events.GPU{{Index: 0}}})
	d := outcome.Decide("j", []store.GPUKey{{Node: "a", Index: 0}, {Node: "b", Index: 0}, {Node: "a", Index: 1}}, "blind")
	Fill(&d, s.Snapshot())
	for _, np := range d.Nodes {
		if np.Torchrun != nil || np.NCCLTopoXML != "" {
			t.Errorf("node %s: %+v", np.Node, np)
		}
	}
	if d.Launch.MPIRankfile != "rank 0=a slot=0\nrank 1=b slot=0\nrank 2=a slot=1\n" {
		t.Errorf("rankfile:\n%s", d.Launch.MPIRankfile)
	}
	if d.Ranks[0].NUMA != nil || d.Ranks[0].NIC != "" {
		t.Errorf("rank 0 without topology: %+v", d.Ranks[0])
	}
}

// TestMasterPort: jobs running with rank 0 on one node have ports of
// their own, whatever mix of placements and releases got them there; a
// released job's port goes to the next job on its GPU; the same decision
// has the same port.
func TestMasterPort(t *testing.T) {
	t.Parallel()
	s := storeWith(t, dgx(t, "a"), dgx(t, "b"))
	key := func(node string, idx int) store.GPUKey { return store.GPUKey{Node: node, Index: idx} }
	type step struct {
		job      string
		gpus     []store.GPUKey // placed on these; nil: released
		wantPort int
	}
	ports := map[string]int{}         // running jobs' ports
	masterNode := map[string]string{} // and their rank 0's node
	for i, st := range []step{
		{job: "j1", gpus: []store.GPUKey{key("a", 0), key("a", 1)}, wantPort: 29500},
		{job: "j2", gpus: []store.GPUKey{key("a", 2), key("a", 3), key("b", 0)}, wantPort: 29502},
		// Rank 0 on b: b's GPU 0 is taken, so its port is b's alone.
		{job: "j3", gpus: []store.GPUKey{key("b", 1), key("a", 4)}, wantPort: 29501},
		{job: "j1"},
		// j1's GPU 0 and with it j1's port.
		{job: "j4", gpus: []store.GPUKey{key("a", 0)}, wantPort: 29500},
		{job: "j5", gpus: []store.GPUKey{key("a", 7), key("a", 6)}, wantPort: 29507},
	} {
		if st.gpus == nil {
			if _, err := s.Release(st.job); err != nil {
				t.Fatal(err)
			}
			delete(ports, st.job)
			continue
		}
		if err := s.Allocate(st.job, st.gpus); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		d := outcome.Decide(st.job, st.gpus, "blind")
		Fill(&d, s.Snapshot())
		if d.Launch.MasterPort != st.wantPort {
			t.Errorf("step %d: %s's port %d, want %d", i, st.job, d.Launch.MasterPort, st.wantPort)
		}
		again := outcome.Decide(st.job, st.gpus, "blind")
		Fill(&again, s.Snapshot())
		if again.Launch.MasterPort != d.Launch.MasterPort {
			t.Errorf("step %d: %s decided again has port %d, first %d", i, st.job, again.Launch.MasterPort, d.Launch.MasterPort)
		}
		for other, p := range ports {
			if p == d.Launch.MasterPort && masterNode[other] == d.Launch.MasterAddr {
				t.Errorf("step %d: %s has %s's port %d on %s", i, st.job, other, p, d.Launch.MasterAddr)
			}
		}
		ports[st.job] = d.Launch.MasterPort
		masterNode[st.job] = d.Launch.MasterAddr
	}
}
