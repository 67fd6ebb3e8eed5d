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
	if got := strings.Join(d.Nodes[1].Torchrun, " "); got != "--nnodes=2 --node_rank=1 --nproc_per_node=2 --master_addr=a --master_port=29500" {
		t.Errorf("torchrun: %s", got)
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
