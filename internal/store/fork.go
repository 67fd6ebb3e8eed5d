package store

// Fork returns a copy of the store that later writes to either do not
// change the other, in O(1) (memdb's trees are immutable; a write copies
// the path it changes). It is for what-ifs: the optimizer releases a
// running job in a fork to plan where the job would go if it moved, and
// drops the fork, without touching the store it serves from.
func (s *Store) Fork() *Store {
	return &Store{db: s.db.Snapshot()}
}
