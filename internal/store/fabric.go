package store

// Fabric domains: ApplyFabric and UpsertFabric record each node's leaf,
// pod and core (TableFabric), whether the node is known yet or not, and
// recompute the domains of the GPUs of the nodes whose fabric changed.

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	memdb "github.com/hashicorp/go-memdb"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/topology"
)

// ApplyFabric builds the switch tree of a topology.fabric report and
// records every listed node's leaf, pod and core as domains of its GPUs,
// returning the tree. A tree that does not hold together changes nothing.
func (s *Store) ApplyFabric(ev events.TopologyFabric) (*topology.Fabric, error) {
	f, err := topology.NewFabric(ev)
	if err != nil {
		return nil, fmt.Errorf("fabric %s: %w", ev.Cluster, err)
	}
	domains := map[string][]string{}
	for _, sw := range ev.Switches {
		for _, n := range sw.Nodes {
			domains[n] = f.Domains(n)
		}
	}
	if err := s.UpsertFabric(domains); err != nil {
		return nil, fmt.Errorf("fabric %s: %w", ev.Cluster, err)
	}
	return f, nil
}

// UpsertFabric sets the fabric domains of every node in one transaction:
// domainsByNode maps a node's name to its domains, as topology.Fabric's
// Domains computes them ("leaf:<name>", "pod:<name>", "core:<name>"). The
// map is the whole fabric: a node it does not list has no fabric domains
// afterwards. Nodes not reported yet keep theirs until they are. A domain
// must read "<kind>:<name>" with a kind the store does not compute itself
// (not island, pcie, numa, node or cluster); duplicates are dropped, the
// order is kept (it is the order of GPU.Domains).
func (s *Store) UpsertFabric(domainsByNode map[string][]string) error {
	intern := map[string]string{}
	want := make(map[string][]string, len(domainsByNode))
	var errs []error
	for _, node := range slices.Sorted(maps.Keys(domainsByNode)) {
		if node == "" {
			errs = append(errs, errors.New("a node without a name"))
			continue
		}
		var ds []string
		for _, d := range domainsByNode[node] {
			kind, name, ok := strings.Cut(d, ":")
			switch {
			case !ok || kind == "" || name == "":
				errs = append(errs, fmt.Errorf("node %q: domain %q: want <kind>:<name>", node, d))
				continue
			case reservedKind(kind):
				errs = append(errs, fmt.Errorf("node %q: domain %q: kind %s is the store's own", node, d, kind))
				continue
			case strings.ContainsRune(d, 0):
				errs = append(errs, fmt.Errorf("node %q: domain %q contains NUL", node, d))
				continue
			}
			if v, ok := intern[d]; ok {
				d = v
			} else {
				intern[d] = d
			}
			if !slices.Contains(ds, d) {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			want[node] = ds
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("store: fabric: %w", err)
	}
	return s.writeTopology(func(w *writer) error {
		var nodes []string
		have := map[string][]string{}
		it, err := w.txn.Get(TableFabric, IndexID)
		if err != nil {
			return err
		}
		for raw := it.Next(); raw != nil; raw = it.Next() {
			f := raw.(*fabricEntry)
			have[f.Node] = f.Domains
			if _, ok := want[f.Node]; !ok {
				nodes = append(nodes, f.Node)
			}
		}
		nodes = append(nodes, slices.Collect(maps.Keys(want))...)
		slices.Sort(nodes)
		for _, node := range nodes {
			ds := want[node]
			if slices.Equal(have[node], ds) {
				continue
			}
			if ds == nil {
				if _, err := w.txn.DeleteAll(TableFabric, IndexID, node); err != nil {
					return err
				}
			} else if err := w.txn.Insert(TableFabric, &fabricEntry{Node: node, Domains: ds}); err != nil {
				return err
			}
			raw, err := w.txn.First(TableNodes, IndexID, node)
			if err != nil {
				return err
			}
			if raw != nil {
				if err := w.redomain(raw.(*Node)); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// fabricEntry is a row of TableFabric: the fabric domains of one node,
// kept whether the node is known yet or not, so that a node reported after
// the fabric gets them.
type fabricEntry struct {
	Node    string
	Domains []string
}

// fabricOf returns the fabric domains of a node, nil when it has none.
func fabricOf(txn *memdb.Txn, node string) ([]string, error) {
	raw, err := txn.First(TableFabric, IndexID, node)
	if err != nil || raw == nil {
		return nil, err
	}
	return raw.(*fabricEntry).Domains, nil
}
