package store

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func nvlinkHealth(node, id, health string) events.TopologyHealth {
	return events.TopologyHealth{Node: node, Component: events.ComponentNVLink, ID: id, Health: health}
}

func nicHealth(node, name, health string) events.TopologyHealth {
	return events.TopologyHealth{Node: node, Component: events.ComponentNIC, ID: name, Health: health}
}

// pairs renders GPU i's row of the node's effective matrix.
func pairs(t *testing.T, snap *Snapshot, node string, i int) []string {
	t.Helper()
	n, ok := snap.Node(node)
	if !ok || n.Effective == nil {
		t.Fatalf("node %s: %v, effective topology %v", node, ok, n.Effective)
	}
	var out []string
	for _, l := range n.Effective.GPUPaths[i] {
		out = append(out, l.String())
	}
	return out
}

func TestNVLinkHealth(t *testing.T) {
	t.Parallel()
	// all is a row of g cells, NV<links> (SYS at zero) but X at self.
	all := func(links, self int, g int) []string {
		out := make([]string, g)
		for j := range out {
			out[j] = "NV" + strconv.Itoa(links)
			if links <= 0 {
				out[j] = "SYS"
			}
		}
		out[self] = "X"
		return out
	}
	tests := []struct {
		name   string
		events []events.TopologyHealth
		row3   []string // GPU3's effective row
		row0   []string // GPU0's
		down   []NVLinkID
		island int // GPUs in island:n/0
	}{
		{
			name:   "one link down degrades that GPU's pairs",
			events: []events.TopologyHealth{nvlinkHealth("n", "3/5", "unhealthy")},
			row3:   all(11, 3, 8),
			row0:   []string{"X", "NV12", "NV12", "NV11", "NV12", "NV12", "NV12", "NV12"},
			down:   []NVLinkID{{3, 5}},
			island: 8,
		},
		{
			name: "the same link twice counts once",
			events: []events.TopologyHealth{
				nvlinkHealth("n", "3/5", "unhealthy"), nvlinkHealth("n", "3/5", "unhealthy"), nvlinkHealth("n", "3/0", "unhealthy"),
			},
			row3:   all(10, 3, 8),
			down:   []NVLinkID{{3, 0}, {3, 5}},
			island: 8,
		},
		{
			name:   "every link down: the GPU leaves the island",
			events: downLinks("n", 3, 12),
			row3:   all(0, 3, 8),
			down: func() []NVLinkID {
				var o []NVLinkID
				for l := range 12 {
					o = append(o, NVLinkID{3, l})
				}
				return o
			}(),
			island: 7,
		},
		{
			name:   "down and up again restores",
			events: append(downLinks("n", 3, 12), upLinks("n", 3, 12)...),
			row3:   all(12, 3, 8),
			island: 8,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			rep := topoReport("n", 0, "A100", nvswitch(8, 12), []int{0, 0, 0, 0, 1, 1, 1, 1}, dgxNICs(8))
			mustUpsert(t, s, rep)
			before := s.Snapshot()
			for _, h := range tt.events {
				if err := s.SetHealth(h); err != nil {
					t.Fatal(err)
				}
			}
			snap := s.Snapshot()
			n, _ := snap.Node("n")
			if got := pairs(t, snap, "n", 3); !slices.Equal(got, tt.row3) {
				t.Errorf("GPU3 effective row %v, want %v", got, tt.row3)
			}
			if tt.row0 != nil {
				if got := pairs(t, snap, "n", 0); !slices.Equal(got, tt.row0) {
					t.Errorf("GPU0 effective row %v, want %v", got, tt.row0)
				}
			}
			if got := n.Topology.GPUPaths[3][0].String(); got != "NV12" {
				t.Errorf("reported topology changed: GPU3-GPU0 %s", got)
			}
			if !slices.Equal(n.DownNVLinks, tt.down) {
				t.Errorf("DownNVLinks %v, want %v", n.DownNVLinks, tt.down)
			}
			if tt.down == nil && n.Effective != n.Topology {
				t.Error("nothing down, but Effective is not Topology")
			}
			// Links is what a one-GPU walk compares nodes by: it must
			// follow the effective topology, not the reported one.
			if n.Links != n.Effective.LinksKey() || (n.Links == n.Topology.LinksKey()) != n.Effective.SameLinks(n.Topology) {
				t.Errorf("Links %x does not follow the effective topology", n.Links)
			}
			if d, _ := snap.Domain("island:n/0"); d.Total != tt.island || d.Free != tt.island {
				t.Errorf("island:n/0 = %+v, want %d GPUs, all free", d, tt.island)
			}
			if len(snap.FreeGPUs("n")) != 8 {
				t.Error("a link down made GPUs unfree")
			}
			// The snapshot from before still has the reported paths.
			if got := pairs(t, before, "n", 3); got[0] != "NV12" {
				t.Errorf("older snapshot changed: %v", got)
			}
			checkDomains(t, snap)
		})
	}
}

func downLinks(node string, gpu, n int) []events.TopologyHealth {
	var out []events.TopologyHealth
	for l := range n {
		out = append(out, nvlinkHealth(node, fmt.Sprintf("%d/%d", gpu, l), "unhealthy"))
	}
	return out
}

func upLinks(node string, gpu, n int) []events.TopologyHealth {
	var out []events.TopologyHealth
	for l := range n {
		out = append(out, nvlinkHealth(node, fmt.Sprintf("%d/%d", gpu, l), "healthy"))
	}
	return out
}

func TestNICHealth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		events  []events.TopologyHealth
		nearest []int // NearestNIC of GPU0, GPU1
		down    []string
		wantErr string
	}{
		{name: "all up", nearest: []int{0, 1}},
		{
			name:    "GPU0's NIC down: the pair's other NIC",
			events:  []events.TopologyHealth{nicHealth("n", "mlx5_0", "unhealthy")},
			nearest: []int{1, 1},
			down:    []string{"mlx5_0"},
		},
		{
			name:    "both NICs of the pair down: the far ones, spread",
			events:  []events.TopologyHealth{nicHealth("n", "mlx5_1", "unhealthy"), nicHealth("n", "mlx5_0", "unhealthy")},
			nearest: []int{2, 3},
			down:    []string{"mlx5_0", "mlx5_1"},
		},
		{
			name:    "down and up again restores",
			events:  []events.TopologyHealth{nicHealth("n", "mlx5_0", "unhealthy"), nicHealth("n", "mlx5_0", "healthy")},
			nearest: []int{0, 1},
		},
		{
			name:    "unknown NIC",
			events:  []events.TopologyHealth{nicHealth("n", "mlx5_9", "unhealthy")},
			nearest: []int{0, 1},
			wantErr: `"mlx5_9"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, topoReport("n", 0, "A100", nvswitch(4, 12), nil, dgxNICs(4)))
			var err error
			for _, h := range tt.events {
				if err = s.SetHealth(h); err != nil {
					break
				}
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
			n, _ := s.Snapshot().Node("n")
			for g, want := range tt.nearest {
				if got := n.Effective.NearestNIC(g); got != want {
					t.Errorf("NearestNIC(%d) = %d, want %d", g, got, want)
				}
				if got := n.Topology.NearestNIC(g); got != g {
					t.Errorf("reported NearestNIC(%d) = %d, want %d", g, got, g)
				}
			}
			if !slices.Equal(n.DownNICs, tt.down) {
				t.Errorf("DownNICs %v, want %v", n.DownNICs, tt.down)
			}
		})
	}

	// A node without a matrix knows no NIC.
	s := newStore(t)
	mustUpsert(t, s, report("p", 0, "A100", 2))
	if err := s.SetHealth(nicHealth("p", "mlx5_0", "unhealthy")); err == nil || !strings.Contains(err.Error(), "mlx5_0") {
		t.Errorf("NIC of a node without topology: %v", err)
	}
}

// TestPartHealthAcrossReports checks what a new node report does to the
// health of links and NICs (see UpsertNode).
func TestPartHealthAcrossReports(t *testing.T) {
	t.Parallel()
	base := func() events.TopologyNode {
		return topoReport("n", 0, "A100", nvswitch(4, 12), nil, dgxNICs(4))
	}
	tests := []struct {
		name      string
		report    func() events.TopologyNode
		wantLinks []NVLinkID
		wantNICs  []string
	}{
		{
			name:      "same report keeps both",
			report:    base,
			wantLinks: []NVLinkID{{1, 0}},
			wantNICs:  []string{"mlx5_2"},
		},
		{
			name: "degraded matrix from the source drops the link record",
			report: func() events.TopologyNode {
				n := base()
				for j := range n.GPUPaths[1] {
					if j != 1 {
						n.GPUPaths[1][j], n.GPUPaths[j][1] = "NV11", "NV11"
					}
				}
				return n
			},
			wantNICs: []string{"mlx5_2"},
		},
		{
			name: "GPU gone drops its links",
			report: func() events.TopologyNode {
				n := topoReport("n", 0, "A100", nvswitch(4, 12), nil, dgxNICs(4))
				n.GPUs[1].Index = 7
				return n
			},
			wantNICs: []string{"mlx5_2"},
		},
		{
			name: "report marks NICs",
			report: func() events.TopologyNode {
				n := base()
				n.NICs[2].Health, n.NICs[3].Health = events.HealthHealthy, events.HealthUnhealthy
				return n
			},
			wantLinks: []NVLinkID{{1, 0}},
			wantNICs:  []string{"mlx5_3"},
		},
		{
			// The topology changed too, so the link record goes as well.
			name: "NIC gone from report forgotten",
			report: func() events.TopologyNode {
				n := base()
				n.NICs = n.NICs[:2]
				for i := range n.NICPaths {
					n.NICPaths[i] = n.NICPaths[i][:2]
				}
				return n
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			mustUpsert(t, s, base())
			for _, h := range []events.TopologyHealth{nvlinkHealth("n", "1/0", "unhealthy"), nicHealth("n", "mlx5_2", "unhealthy")} {
				if err := s.SetHealth(h); err != nil {
					t.Fatal(err)
				}
			}
			mustUpsert(t, s, tt.report())
			snap := s.Snapshot()
			n, _ := snap.Node("n")
			if !slices.Equal(n.DownNVLinks, tt.wantLinks) || !slices.Equal(n.DownNICs, tt.wantNICs) {
				t.Errorf("down links %v NICs %v, want %v %v", n.DownNVLinks, n.DownNICs, tt.wantLinks, tt.wantNICs)
			}
			if (tt.wantLinks == nil && tt.wantNICs == nil) != (n.Effective == n.Topology) {
				t.Errorf("Effective is Topology: %v", n.Effective == n.Topology)
			}
			checkDomains(t, snap)
		})
	}
}

// TestPartHealthNoOp checks that a health report that changes nothing
// writes nothing.
func TestPartHealthNoOp(t *testing.T) {
	t.Parallel()
	s := watchedStore(t)
	mustUpsert(t, s, topoReport("n", 0, "A100", nvswitch(2, 12), nil, dgxNICs(2)))
	for _, h := range []events.TopologyHealth{nvlinkHealth("n", "0/1", "healthy"), nicHealth("n", "mlx5_0", "healthy")} {
		before, _ := s.Snapshot().Node("n")
		ch := s.Snapshot().watchFreeIn("node:n", "")
		if err := s.SetHealth(h); err != nil {
			t.Fatal(err)
		}
		after, _ := s.Snapshot().Node("n")
		if after.Effective != before.Effective {
			t.Errorf("%s %s healthy again rewrote the node", h.Component, h.ID)
		}
		select {
		case <-ch:
			t.Errorf("%s %s healthy again fired a watch", h.Component, h.ID)
		default:
		}
	}
}
