package store

import (
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
	tables := map[string]map[string]want{
		TableNodes: {IndexID: {unique: true}, IndexPosition: {}},
		TableGPUs:  {IndexID: {unique: true}, IndexNode: {}, IndexOrder: {}, IndexFree: {}, IndexJob: {allowMissing: true}},
		TableJobs:  {IndexID: {unique: true}, IndexState: {}},
		TableIndex: {IndexID: {unique: true}},
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

	if _, ok := s.Tables[TableGPUs].Indexes[IndexID].Indexer.(*memdb.CompoundIndex); !ok {
		t.Errorf("gpus id index is %T, want *memdb.CompoundIndex", s.Tables[TableGPUs].Indexes[IndexID].Indexer)
	}
	if _, ok := s.Tables[TableGPUs].Indexes[IndexFree].Indexer.(*memdb.ConditionalIndex); !ok {
		t.Errorf("gpus free index is %T, want *memdb.ConditionalIndex", s.Tables[TableGPUs].Indexes[IndexFree].Indexer)
	}
}
