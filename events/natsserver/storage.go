package natsserver

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
)

// Storage sizing: JetStream may grow to what it holds already plus
// DiskShare of the filesystem's free space, never below MinMaxStore.
const (
	// DiskShareNum/DiskShareDen is the share of the free space JetStream
	// may take (0.9): the rest is headroom for the store's own metadata
	// and for whatever else writes to the filesystem.
	DiskShareNum = 9
	DiskShareDen = 10
	// MinMaxStore is the floor of the limit, so that the server still
	// starts (and answers "insufficient resources") on a full disk.
	MinMaxStore = 1 << 20
)

// CheckStoreDir creates dir if it is missing and checks that a file can be
// written in it, so that a read-only or uncreatable store fails at once,
// naming the path, instead of leaving JetStream unable to start.
func CheckStoreDir(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("data dir %s: cannot create it: %w", dir, err)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("data dir %s: %w", dir, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("data dir %s: not a directory", dir)
	}
	f, err := os.CreateTemp(dir, ".toposched-write-check-*")
	if err != nil {
		return fmt.Errorf("data dir %s: not writable: %w", dir, err)
	}
	name := f.Name()
	_, werr := f.Write([]byte("ok\n"))
	cerr := f.Close()
	rerr := os.Remove(name)
	if err := errors.Join(werr, cerr, rerr); err != nil {
		return fmt.Errorf("data dir %s: not writable: %w", dir, err)
	}
	return nil
}

// SizeStore is JetStream's file storage limit: the configured one, capped
// by what the store holds already (used) plus DiskShare of the
// filesystem's free space, and at least MinMaxStore.
func SizeStore(configured int64, used, free uint64) int64 {
	limit := configured
	if room := used + free/DiskShareDen*DiskShareNum; room < uint64(limit) {
		limit = int64(room)
	}
	return max(limit, MinMaxStore)
}

// sizeStore applies SizeStore to the options and logs the figure.
func sizeStore(opts *server.Options, log *slog.Logger) error {
	configured := opts.JetStreamMaxStore
	free, err := freeBytes(opts.StoreDir)
	if errors.Is(err, errors.ErrUnsupported) {
		log.Info("JetStream file storage limit (free disk space unknown on this system)",
			"max_store", configured, "data_dir", opts.StoreDir)
		return nil
	}
	if err != nil {
		return fmt.Errorf("data dir %s: free space: %w", opts.StoreDir, err)
	}
	used, err := dirSize(filepath.Join(opts.StoreDir, server.JetStreamStoreDir))
	if err != nil {
		return fmt.Errorf("data dir %s: size of the store: %w", opts.StoreDir, err)
	}
	opts.JetStreamMaxStore = SizeStore(configured, used, free)
	attrs := []any{"max_store", opts.JetStreamMaxStore, "configured", configured, "disk_free", free, "store_used", used, "data_dir", opts.StoreDir}
	if opts.JetStreamMaxStore < configured {
		log.Warn("JetStream file storage limited by the data dir's free disk space", attrs...)
		return nil
	}
	log.Info("JetStream file storage limit", attrs...)
	return nil
}

// dirSize is the total size of the regular files under dir; 0 if dir does
// not exist yet.
func dirSize(dir string) (uint64, error) {
	var total uint64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		total += uint64(info.Size())
		return nil
	})
	return total, err
}

// Storage is JetStream's file storage as the server sees it, with the free
// space of its filesystem.
type Storage struct {
	// Disabled is set when JetStream is off: it shuts itself down after
	// a critical write error, such as a full disk.
	Disabled bool
	// Used and Max are the bytes stored and the limit (MaxStore).
	Used, Max uint64
	// DiskFree is the filesystem's free space; DiskKnown is false where
	// it cannot be read.
	DiskFree  uint64
	DiskKnown bool
}

// Storage reads the server's JetStream usage and the disk's free space;
// both are cheap (no I/O beyond a statfs).
func (s *Server) Storage() (Storage, error) {
	jsi, err := s.ns.Jsz(&server.JSzOptions{})
	if err != nil {
		return Storage{}, fmt.Errorf("jetstream stats: %w", err)
	}
	st := Storage{Disabled: jsi.Disabled, Used: jsi.Store, Max: uint64(max(jsi.Config.MaxStore, 0))}
	free, err := freeBytes(s.storeDir)
	switch {
	case err == nil:
		st.DiskFree, st.DiskKnown = free, true
	case !errors.Is(err, errors.ErrUnsupported):
		return st, fmt.Errorf("data dir %s: free space: %w", s.storeDir, err)
	}
	return st, nil
}
