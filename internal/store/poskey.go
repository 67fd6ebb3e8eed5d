package store

import (
	"fmt"

	memdb "github.com/hashicorp/go-memdb"
)

// appendPosition appends a node position to an index key, ordered as the
// positions are, four bits a byte (sixteen bytes, the sign flipped as
// memdb flips an int's).
//
// Why not eight bytes, as memdb encodes an int: go-immutable-radix copies
// every tree node on the path it writes, edges and all, and with eight
// bytes the last one branches up to 256 ways wherever more than 256 nodes
// share the prefix (the cluster's and a pod's free GPUs, the order of
// every GPU, the nodes with k free GPUs): 4 KB copied for each such node
// on each write. Every allocation and release writes several of them, in
// placement's store and in the optimizer's. Sixteen ways at most costs a
// few more tree nodes and eight bytes a key.
func appendPosition(b []byte, pos int) []byte {
	v := uint64(int64(pos)) ^ (1 << 63)
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, byte(v>>shift)&0xf)
	}
	return b
}

// positionKeyLen is the length appendPosition appends.
const positionKeyLen = 16

// positionIndexer indexes nodes by Position with appendPosition's key; a
// walk of it with no argument yields them in position order (then, for a
// non-unique index, by the primary key memdb appends).
type positionIndexer struct{}

func (positionIndexer) FromObject(obj any) (bool, []byte, error) {
	n, ok := obj.(*Node)
	if !ok {
		return false, nil, fmt.Errorf("store: position index: unexpected %T", obj)
	}
	pos := n.Position
	// Room for what memdb appends to a non-unique key (the primary key),
	// so its append does not copy.
	return true, appendPosition(make([]byte, 0, positionKeyLen+32), pos), nil
}

// FromArgs takes a position.
func (positionIndexer) FromArgs(args ...any) ([]byte, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("store: position index: want a position, got %d arguments", len(args))
	}
	pos, ok := args[0].(int)
	if !ok {
		return nil, fmt.Errorf("store: position index: argument %#v is not an int", args[0])
	}
	return appendPosition(nil, pos), nil
}

var _ memdb.SingleIndexer = positionIndexer{}
