package slurmconf

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
)

// DiffGres lists how a parsed gres.conf differs from what WriteGres makes
// of nodes with opts, one line per difference, each naming the node, the
// GPU and the key: the topology facts gres.conf carries (how many GPUs,
// their types, device files, cores and NVLink counts) must be the same.
// Equal facts give no lines.
func DiffGres(nodes []events.TopologyNode, opts Options, got Gres) ([]string, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	var diffs []string
	known := map[string]bool{}
	for _, n := range nodes {
		if n.Removed || len(n.GPUs) == 0 {
			continue
		}
		known[n.Name] = true
		want, err := nodeGPUs(n, opts)
		if err != nil {
			return nil, err
		}
		have, named := got.Nodes[n.Name]
		if !named {
			have = got.Global
		}
		if len(have) != len(want) {
			diffs = append(diffs, fmt.Sprintf("node %s: gres.conf gives %d GPUs, the cluster %d", n.Name, len(have), len(want)))
			continue
		}
		for i, w := range want {
			h := have[i]
			at := ""
			if h.Line > 0 {
				at = fmt.Sprintf(" (line %d)", h.Line)
			}
			for _, f := range []struct{ key, have, want string }{
				{"Type", h.Type, w.Type},
				{"File", h.File, w.File},
				{"Cores", FormatCPUList(h.Cores), FormatCPUList(w.Cores)},
				{"Links", formatLinks(h.Links), formatLinks(w.Links)},
			} {
				if f.have != f.want {
					diffs = append(diffs, fmt.Sprintf("node %s: gpu %d: %s: gres.conf%s gives %s, the cluster %s", n.Name, i, f.key, at, orNone(f.have), orNone(f.want)))
				}
			}
		}
	}
	for _, n := range got.Order {
		if !known[n] {
			diffs = append(diffs, fmt.Sprintf("node %s: in gres.conf, not a node with GPUs in the cluster", n))
		}
	}
	return diffs, nil
}

// DiffTopology lists how a topology.conf's fabric (as fabric.ParseSlurm
// reads it) differs from the tree SlurmTree makes of fab: switches missing
// or extra, and per switch its tier, nodes and child switches (as sets:
// their order means nothing to Slurm). Equal trees give no lines.
func DiffTopology(fab events.TopologyFabric, got events.TopologyFabric) ([]string, error) {
	want, _, err := SlurmTree(fab)
	if err != nil {
		return nil, err
	}
	have := map[string]events.Switch{}
	for _, s := range got.Switches {
		have[s.Name] = s
	}
	var diffs []string
	for _, w := range want.Switches {
		h, ok := have[w.Name]
		if !ok {
			diffs = append(diffs, fmt.Sprintf("switch %s: in the cluster's fabric, not in topology.conf", w.Name))
			continue
		}
		delete(have, w.Name)
		if h.Tier != w.Tier {
			diffs = append(diffs, fmt.Sprintf("switch %s: tier: topology.conf makes it a %s, the cluster a %s", w.Name, h.Tier, w.Tier))
		}
		for _, f := range []struct {
			key        string
			have, want []string
		}{{"Nodes", h.Nodes, w.Nodes}, {"Switches", h.Switches, w.Switches}} {
			hs, ws := sortedSet(f.have), sortedSet(f.want)
			if !slices.Equal(hs, ws) {
				diffs = append(diffs, fmt.Sprintf("switch %s: %s: topology.conf gives %s, the cluster %s", w.Name, f.key, orNone(strings.Join(hs, ",")), orNone(strings.Join(ws, ","))))
			}
		}
	}
	for _, s := range got.Switches {
		if _, extra := have[s.Name]; extra {
			diffs = append(diffs, fmt.Sprintf("switch %s: in topology.conf, not in the cluster's fabric", s.Name))
		}
	}
	return diffs, nil
}

func sortedSet(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

func formatLinks(links []int) string {
	parts := make([]string, len(links))
	for i, l := range links {
		parts[i] = strconv.Itoa(l)
	}
	return strings.Join(parts, ",")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
