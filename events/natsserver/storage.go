package natsserver

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

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
	// DefaultStorageCheck is how often a running server sizes its file
	// storage again from the free space (Config.StorageCheck).
	DefaultStorageCheck = 5 * time.Second
	// minRoom is the least room (DiskShare of the free space) in which a
	// JetStream that a write error switched off is started again.
	minRoom = 64 << 10
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
func sizeStore(opts *server.Options, freeSpace func(string) (uint64, error), log *slog.Logger) error {
	configured := opts.JetStreamMaxStore
	free, err := freeSpace(opts.StoreDir)
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
	free, err := s.free(s.storeDir)
	switch {
	case err == nil:
		st.DiskFree, st.DiskKnown = free, true
	case !errors.Is(err, errors.ErrUnsupported):
		return st, fmt.Errorf("data dir %s: free space: %w", s.storeDir, err)
	}
	return st, nil
}

// Storage limits follow the free space while the server runs: every
// StorageCheck it sizes the limit again as Start did, from what JetStream
// stores and what the filesystem has free. nats-server lets a running
// server's max_file_store grow (a configuration reload) but not shrink,
// so:
//
//   - more room (the disk enlarged, or another file removed): the
//     server's limit is raised;
//   - less room (something else filled the disk): the account the
//     services use is given a limit below the server's, so that JetStream
//     answers "storage full" rather than write into a full disk, which
//     would switch it off. Where the configuration has accounts of its
//     own their limits are the operator's, and this is not done;
//   - JetStream off all the same (a write error): it is started again,
//     from its store directory as a restart would, once there is room.
//
// Each change is logged.

// watchStorage fits the storage limits every check until stop is closed.
func (s *Server) watchStorage(check time.Duration) {
	defer close(s.watched)
	tick := time.NewTicker(check)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		if err := s.fitStorage(); err != nil {
			s.log.Warn("JetStream file storage: cannot size it from the free space", "data_dir", s.storeDir, "err", err)
		}
	}
}

// slack is how far a new limit must be from the one in force to be
// applied: a busy store moves the figure a little on every check.
func slack(limit int64) int64 { return max(limit/32, minRoom) }

// fitStorage sizes the limits once from the free space (see above).
func (s *Server) fitStorage() error {
	free, err := s.free(s.storeDir)
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("free space: %w", err)
	}
	jsi, err := s.ns.Jsz(&server.JSzOptions{})
	if err != nil {
		return fmt.Errorf("jetstream stats: %w", err)
	}
	if jsi.Disabled {
		return s.restartJetStream(free)
	}
	fit := min(s.configured, int64(jsi.Store+free/DiskShareDen*DiskShareNum))
	cur := s.maxStore.Load()
	attrs := []any{"disk_free", free, "store_used", jsi.Store, "data_dir", s.storeDir}
	if fit > cur+slack(cur) {
		if err := s.raiseMaxStore(fit); err != nil {
			return err
		}
		s.log.Info("JetStream file storage limit raised: the data dir's filesystem has more free space",
			append([]any{"max_store", fit, "was", cur}, attrs...)...)
		cur = fit
	}
	want := int64(0) // no account limit: the server's is the one
	if fit < cur-slack(cur) {
		want = max(fit, 1)
	}
	if want == s.accountMax || (want != 0 && s.accountMax != 0 && abs(want-s.accountMax) <= slack(s.accountMax)) {
		return nil
	}
	return s.limitAccount(want, cur, attrs)
}

func abs(n int64) int64 { return max(n, -n) }

// raiseMaxStore raises the server's max_file_store by a configuration
// reload of the options it was started with.
func (s *Server) raiseMaxStore(limit int64) error {
	err := s.reload(func(opts *server.Options) { opts.JetStreamMaxStore = limit })
	if err != nil {
		return fmt.Errorf("raise max_file_store to %d: %w", limit, err)
	}
	s.maxStore.Store(limit)
	return nil
}

// limitAccount gives the services' account a file storage limit below
// the server's, or lifts it (0).
func (s *Server) limitAccount(limit, serverMax int64, attrs []any) error {
	if !s.globalOnly {
		if !s.warnedAccounts {
			s.warnedAccounts = true
			s.log.Warn("JetStream file storage: the data dir's filesystem has less free space than the limit allows, "+
				"and the configuration's accounts keep their own limits (a full disk may switch JetStream off)",
				append([]any{"max_store", serverMax}, attrs...)...)
		}
		return nil
	}
	acc := s.ns.GlobalAccount()
	limits := server.JetStreamAccountLimits{MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1,
		MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1}
	if limit > 0 {
		limits.MaxStore = limit
	}
	if err := acc.UpdateJetStreamLimits(map[string]server.JetStreamAccountLimits{"": limits}); err != nil {
		return fmt.Errorf("account %s: file storage limit %d: %w", acc.Name, limit, err)
	}
	was := s.accountMax
	s.accountMax = limit
	if limit > 0 {
		msg, args := "JetStream file storage limited below its limit: the data dir's filesystem has less free space",
			append([]any{"account_max_store", limit, "max_store", serverMax}, attrs...)
		if was == 0 {
			s.log.Warn(msg, args...)
		} else {
			s.log.Info(msg, append(args, "was", was)...)
		}
		return nil
	}
	s.log.Info("JetStream file storage back to its limit: the data dir's filesystem has the room again",
		append([]any{"max_store", serverMax}, attrs...)...)
	return nil
}

// restartJetStream starts JetStream again after it switched itself off (a
// write failed: a full disk), once the filesystem has room. It recovers
// its streams and consumers from the store directory, as a restart would.
func (s *Server) restartJetStream(free uint64) error {
	// Its configuration stays until the shutdown has ended: one started
	// before would be shut down with it.
	if s.ns.JetStreamConfig() != nil || free/DiskShareDen*DiskShareNum < minRoom {
		return nil
	}
	s.reloadMu.Lock()
	opts := s.base
	s.reloadMu.Unlock()
	cfg := &server.JetStreamConfig{
		StoreDir: opts.StoreDir, MaxMemory: opts.JetStreamMaxMemory, MaxStore: s.maxStore.Load(),
		SyncInterval: opts.SyncInterval, SyncAlways: opts.SyncAlways, Domain: opts.JetStreamDomain, Strict: !opts.NoJetStreamStrict,
	}
	if err := s.ns.EnableJetStream(cfg); err != nil {
		return fmt.Errorf("start JetStream again: %w", err)
	}
	// Its accounts start again without the limit given before: the next
	// check gives it again if the room is still short.
	s.accountMax = 0
	s.log.Warn("JetStream started again: it had switched itself off, and the data dir's filesystem has room now",
		"disk_free", free, "max_store", cfg.MaxStore, "data_dir", s.storeDir)
	return nil
}
