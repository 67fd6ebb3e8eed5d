// Copyright (c) HashiCorp, Inc.
// SPDX-License-Identifier: MPL-2.0

package memdb

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// dump lists every object of the main table by the index given, in order.
func dump(t *testing.T, txn *Txn, index string, args ...interface{}) []string {
	t.Helper()
	it, err := txn.Get("main", index, args...)
	if err != nil {
		t.Fatalf("get %s: %v", index, err)
	}
	var out []string
	for obj := it.Next(); obj != nil; obj = it.Next() {
		o := obj.(*TestObject)
		out = append(out, fmt.Sprintf("%s/%s/%v", o.ID, o.Foo, o.Qux))
	}
	return out
}

// TestLiveReads_SameAsClones applies one seeded sequence of writes and
// reads to two databases, one through a transaction with live reads, and
// checks every read and the committed result agree, and that a snapshot
// taken before is untouched.
func TestLiveReads_SameAsClones(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewSource(seed))
			plain, live := testDB(t), testDB(t)
			for _, db := range []*MemDB{plain, live} {
				txn := db.Txn(true)
				for i := 0; i < 50; i++ {
					if err := txn.Insert("main", &TestObject{ID: fmt.Sprint(i), Foo: fmt.Sprint(i % 7), Qux: []string{fmt.Sprint(i % 3)}}); err != nil {
						t.Fatal(err)
					}
				}
				txn.Commit()
			}
			before := live.Txn(false)
			want := dump(t, before, "id")

			tp, tl := plain.Txn(true), live.Txn(true)
			tl.LiveReads()
			for step := 0; step < 400; step++ {
				id := fmt.Sprint(rng.Intn(80))
				switch op := rng.Intn(5); op {
				case 0, 1:
					qux := []string{fmt.Sprint(rng.Intn(3)), fmt.Sprint(rng.Intn(3) + 3)}
					foo := fmt.Sprint(rng.Intn(7))
					for _, txn := range []*Txn{tp, tl} {
						if err := txn.Insert("main", &TestObject{ID: id, Foo: foo, Qux: qux}); err != nil {
							t.Fatal(err)
						}
					}
				case 2:
					for _, txn := range []*Txn{tp, tl} {
						if _, err := txn.DeleteAll("main", "id", id); err != nil {
							t.Fatal(err)
						}
					}
				case 3:
					foo := fmt.Sprint(rng.Intn(7))
					if a, b := dump(t, tp, "foo", foo), dump(t, tl, "foo", foo); !reflect.DeepEqual(a, b) {
						t.Fatalf("step %d: foo=%s: clone %v, live %v", step, foo, a, b)
					}
				case 4:
					a, _ := tp.First("main", "id", id)
					b, _ := tl.First("main", "id", id)
					if !reflect.DeepEqual(a, b) {
						t.Fatalf("step %d: id=%s: clone %v, live %v", step, id, a, b)
					}
				}
			}
			if a, b := dump(t, tp, "qux", "1"), dump(t, tl, "qux", "1"); !reflect.DeepEqual(a, b) {
				t.Fatalf("qux=1: clone %v, live %v", a, b)
			}
			tp.Commit()
			tl.Commit()
			for _, index := range []string{"id", "foo", "qux"} {
				if a, b := dump(t, plain.Txn(false), index), dump(t, live.Txn(false), index); !reflect.DeepEqual(a, b) {
					t.Fatalf("committed, by %s: clone %v, live %v", index, a, b)
				}
			}
			if got := dump(t, before, "id"); !reflect.DeepEqual(got, want) {
				t.Fatalf("snapshot before the transaction changed: %v, was %v", got, want)
			}
		})
	}
}

func TestLiveReads_IteratorAfterWritePanics(t *testing.T) {
	db := testDB(t)
	txn := db.Txn(true)
	txn.LiveReads()
	for _, id := range []string{"a", "b", "c"} {
		if err := txn.Insert("main", &TestObject{ID: id, Foo: "x", Qux: []string{"q"}}); err != nil {
			t.Fatal(err)
		}
	}
	it, err := txn.Get("main", "foo", "x")
	if err != nil {
		t.Fatal(err)
	}
	if it.Next() == nil {
		t.Fatal("no first row")
	}
	if err := txn.Insert("main", &TestObject{ID: "d", Foo: "x", Qux: []string{"q"}}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "after a write") {
			t.Fatalf("recovered %v, want the live reads panic", r)
		}
	}()
	it.Next()
}

func TestLiveReads_DeletePrefix(t *testing.T) {
	db := testDB(t)
	txn := db.Txn(true)
	txn.LiveReads()
	for _, id := range []string{"aa", "ab", "ac", "b"} {
		if err := txn.Insert("main", &TestObject{ID: id, Foo: id, Qux: []string{"q"}}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := txn.DeletePrefix("main", "id_prefix", "a"); err != nil || !ok {
		t.Fatalf("DeletePrefix: %v %v", ok, err)
	}
	if got := dump(t, txn, "foo"); !reflect.DeepEqual(got, []string{"b/b/[q]"}) {
		t.Fatalf("left %v", got)
	}
}

// TestLiveReads_KeepsCopiedNodes is what the patch is for: a write after a
// read reuses the nodes the transaction copied before.
func TestLiveReads_KeepsCopiedNodes(t *testing.T) {
	allocs := func(live bool) float64 {
		db := testDB(t)
		txn := db.Txn(true)
		for i := 0; i < 1000; i++ {
			if err := txn.Insert("main", &TestObject{ID: fmt.Sprintf("%04d", i), Foo: "x", Qux: []string{"q"}}); err != nil {
				t.Fatal(err)
			}
		}
		txn.Commit()
		txn = db.Txn(true)
		if live {
			txn.LiveReads()
		}
		obj := &TestObject{ID: "0500", Foo: "y", Qux: []string{"q"}}
		return testing.AllocsPerRun(100, func() {
			if err := txn.Insert("main", obj); err != nil {
				t.Fatal(err)
			}
			if _, err := txn.First("main", "id", "0500"); err != nil {
				t.Fatal(err)
			}
		})
	}
	clone, live := allocs(false), allocs(true)
	if live*2 > clone {
		t.Fatalf("allocations of a write and a read: %.0f with live reads, %.0f without", live, clone)
	}
}

func TestLiveReads_ReadTxn(t *testing.T) {
	db := testDB(t)
	txn := db.Txn(false)
	txn.LiveReads()
	if txn.live {
		t.Fatal("live reads on a read transaction")
	}
}
