package store

import (
	"slices"
	"testing"

	memdb "github.com/hashicorp/go-memdb"
)

func TestSchema(t *testing.T) {
	t.Parallel()
	s := schema()
	if err := s.Validate(); err != nil {
		t.Fatalf("schema does not validate: %v", err)
	}
	if _, err := memdb.NewMemDB(s); err != nil {
		t.Fatalf("NewMemDB: %v", err)
	}

	type want struct {
		unique, allowMissing bool
	}
	// The index budget. Every index entry costs ~450 B (an iradix leaf and
	// node, each with a watch channel), so an index is added only for a read
	// that needs it, and this table is its bill. BenchmarkLoad, 100k GPUs
	// on DGX-like nodes (one leaf, pod and core per node), heap per GPU:
	// 2035 B bare (no inner topology, no fabric), 2950 B with the nodes'
	// topology, 3944 B with the fabric too.
	//   - gpus: id, one entry per GPU (a node's GPUs are a prefix walk of
	//     it: gpuKeyIndexer, ~380 B per GPU less than the node index it
	//     replaced; an order index, by node position, went too: no reader
	//     of the product walked it); job, one per
	//     held GPU; domain, one per free GPU per leaf, pod or cluster it is
	//     in. Its cluster entries are the former "free" index; the leaf and
	//     pod entries cost ~860 B per free GPU. Left out, and measured: core
	//     domains (~430 B per GPU and core, for a domain usually as wide as
	//     the cluster; FreeGPUsIn walks the cluster's entries for them), and
	//     node-local domains (island, numa, node on a DGX: ~1450 B per GPU;
	//     a prefix walk of the primary key by node reaches their GPUs).
	//   - domains: id, one entry per domain: 6 node-local ones per DGX
	//     node (node, island, 4 NUMA; the island and NUMA rows ~405 B per
	//     GPU, rows and all), then the fabric's and the cluster.
	//     DomainsOfKind is a prefix walk of it, not a kind index. And
	//     nodefree, one entry per node with free GPUs and per model it has
	//     free GPUs of, plus one for any model (~2 per node with free GPUs
	//     on a one-model cluster, ~110 B per GPU of 8-GPU nodes): what
	//     lets placement take the best-fitting or first nodes without a
	//     walk of the cluster.
	//   - fabric: id only, one entry per node the fabric names (~85 B per
	//     GPU).
	//   - nodecounts: id only, one row per GPU model and one for any.
	//   - jobs: id and state, one entry per job each; queue, one per
	//     pending job, so that the head of the queue is one lookup.
	tables := map[string]map[string]want{
		TableNodes:      {IndexID: {unique: true}, IndexPosition: {}},
		TableGPUs:       {IndexID: {unique: true}, IndexJob: {allowMissing: true}, IndexDomain: {allowMissing: true}},
		TableJobs:       {IndexID: {unique: true}, IndexState: {}, IndexQueue: {allowMissing: true}},
		TableIndex:      {IndexID: {unique: true}},
		TableDomains:    {IndexID: {unique: true}, IndexNodeFree: {allowMissing: true}},
		TableFabric:     {IndexID: {unique: true}},
		TableNodeCounts: {IndexID: {unique: true}},
	}
	if len(s.Tables) != len(tables) {
		t.Errorf("schema has %d tables, want %d", len(s.Tables), len(tables))
	}
	for name, indexes := range tables {
		ts, ok := s.Tables[name]
		if !ok {
			t.Errorf("table %q missing", name)
			continue
		}
		if ts.Name != name {
			t.Errorf("table %q is named %q", name, ts.Name)
		}
		if len(ts.Indexes) != len(indexes) {
			t.Errorf("table %q has %d indexes, want %d (each costs ~450 B a row)", name, len(ts.Indexes), len(indexes))
		}
		for iname, w := range indexes {
			is, ok := ts.Indexes[iname]
			if !ok {
				t.Errorf("table %q: index %q missing", name, iname)
				continue
			}
			if is.Name != iname || is.Unique != w.unique || is.AllowMissing != w.allowMissing {
				t.Errorf("table %q index %q: name %q unique %v allowMissing %v, want unique %v allowMissing %v",
					name, iname, is.Name, is.Unique, is.AllowMissing, w.unique, w.allowMissing)
			}
		}
	}

	if _, ok := s.Tables[TableGPUs].Indexes[IndexID].Indexer.(gpuKeyIndexer); !ok {
		t.Errorf("gpus id index is %T, want gpuKeyIndexer", s.Tables[TableGPUs].Indexes[IndexID].Indexer)
	}
	if _, ok := s.Tables[TableGPUs].Indexes[IndexDomain].Indexer.(memdb.MultiIndexer); !ok {
		t.Errorf("gpus domain index is %T, want a memdb.MultiIndexer", s.Tables[TableGPUs].Indexes[IndexDomain].Indexer)
	}
}

// A node's GPUs are a prefix walk of the GPU table's primary key by its
// name, which yields that node's GPUs alone, in index order, and not those
// of a node whose name begins with it; its watch channel fires on a change
// to that node's GPUs.
func TestNodeGPUsByPrimaryKey(t *testing.T) {
	t.Parallel()
	s := watchedStore(t)
	mustUpsert(t, s, report("n1", 0, "A100", 2), report("n10", 1, "A100", 3), report("n", 2, "A100", 1))
	snap := s.Snapshot()
	for _, c := range []struct {
		node string
		want []GPUKey
	}{
		{"n1", keys("n1", 0, 1)},
		{"n10", keys("n10", 0, 1, 2)},
		{"n", keys("n", 0)},
		{"n2", nil},
	} {
		if got := gpuKeys(snap.GPUs(c.node)); !slices.Equal(got, c.want) {
			t.Errorf("GPUs(%q) = %v, want %v", c.node, got, c.want)
		}
	}
	watch := snap.watchFreeIn(DomainNode+":n1", "")
	if err := s.Allocate("a", keys("n10", 0)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-watch:
		t.Fatal("n1's watch fired on a change to n10")
	default:
	}
	if err := s.Allocate("b", keys("n1", 1)); err != nil {
		t.Fatal(err)
	}
	<-watch
}
