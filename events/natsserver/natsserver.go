// Package natsserver runs an embedded NATS server with JetStream, the
// default backbone of a one-process toposched and of the service tests.
//
// Clients connect over TCP loopback, not with nats.InProcessServer: pull
// consumers over in-process connections were measured to stall for 30 s in
// about one run in six (see the README, "Why each dependency").
//
// The server is secure by default: it listens on loopback unless told
// otherwise, and refuses to listen anywhere else without authentication
// (users from a configuration file, or the nkey users of
// EnsureCredentials). Before it starts it checks that its store directory
// can be written, and it sizes JetStream's file storage from the free space
// of that directory's filesystem, so that a small disk fills up as a clean
// "insufficient resources" answer rather than as write errors; while it
// runs it keeps the limits fitted to the free space (storage.go), so that
// a disk enlarged or freed is used without a restart.
package natsserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Defaults of a Config that leaves them zero.
const (
	// DefaultMaxMemory bounds JetStream's memory storage: modest, rather
	// than nats-server's share of the host's RAM.
	DefaultMaxMemory = 256 << 20
	// DefaultMaxStore bounds JetStream's file storage before the disk's
	// free space is taken into account (SizeStore).
	DefaultMaxStore = 8 << 30
	// MaxPayload is the largest message the server takes: large gangs
	// produce decisions of a few hundred KB, and the streams allow 8 MB.
	MaxPayload = 8 << 20
	// ReadyTimeout is how long Start waits for the server to accept
	// connections; a failure the server logs ends the wait at once.
	ReadyTimeout = 30 * time.Second
)

// readyPoll is how often Start looks whether the server has logged a fatal
// error while it waits for it to become ready.
const readyPoll = 50 * time.Millisecond

// Config says where the server listens and keeps its streams.
type Config struct {
	// Host is the listen address; empty is loopback (127.0.0.1), or the
	// config file's listen address when ConfigFile sets one. A host that
	// is not loopback needs authentication (see Start).
	Host string
	// Port is the client port; -1 picks a free one; 0 is the config
	// file's port or 4222.
	Port int
	// StoreDir holds the file-backed streams. Required unless ConfigFile
	// sets jetstream.store_dir: an embedded server that forgets its
	// streams on restart would lose pending jobs.
	StoreDir string
	// ServerName names the server in logs and cluster routes.
	ServerName string
	// MaxMemory and MaxStore bound JetStream; zero takes the config
	// file's max_memory_store and max_file_store, else DefaultMaxMemory
	// and DefaultMaxStore. The file storage is then capped by the free
	// space of StoreDir's filesystem (SizeStore).
	MaxMemory int64
	MaxStore  int64
	// ConfigFile is a nats-server configuration file: users, accounts,
	// TLS, limits (deploy/nats/standalone.conf is one). Host, Port,
	// StoreDir, MaxMemory and MaxStore, where set, override its listen,
	// store_dir and JetStream limits.
	ConfigFile string
	// Credentials are nkey users the server accepts (EnsureCredentials);
	// they turn authentication on. Not together with ConfigFile.
	Credentials *Credentials
	// Logger receives the server's log lines; nil silences them. Start's
	// errors carry the last warnings and errors either way.
	Logger *slog.Logger
	// StorageCheck is how often the running server sizes its file
	// storage again from the free space (storage.go); zero is
	// DefaultStorageCheck.
	StorageCheck time.Duration

	// freeSpace reads a filesystem's free space; nil is the system's
	// (a test's stands in for a disk that fills and grows).
	freeSpace func(dir string) (uint64, error)
}

// DefaultConfig listens on 127.0.0.1:4222.
func DefaultConfig() Config {
	return Config{Host: "127.0.0.1", Port: 4222, ServerName: "toposched"}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.StoreDir == "" && c.ConfigFile == "" {
		errs = append(errs, errors.New("store dir: required"))
	}
	if c.Port < -1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d: out of range", c.Port))
	}
	if c.MaxMemory < 0 || c.MaxStore < 0 {
		errs = append(errs, fmt.Errorf("max memory %d, max store %d: must not be negative", c.MaxMemory, c.MaxStore))
	}
	if c.StorageCheck < 0 {
		errs = append(errs, fmt.Errorf("storage check %v: must not be negative", c.StorageCheck))
	}
	if c.ConfigFile != "" && c.Credentials != nil {
		errs = append(errs, errors.New("config file and generated credentials: choose one (put the users in the config file)"))
	}
	return errors.Join(errs...)
}

// Server is a running embedded NATS server.
type Server struct {
	ns *server.Server
	// reloadMu orders configuration reloads and guards base. opts are the
	// options the server was started with.
	reloadMu sync.Mutex
	opts     *server.Options
	storeDir string
	log      *slog.Logger

	// The file storage limits (storage.go). base is a copy of the
	// options in force, which reloads change (reload); configured is the
	// limit before the disk capped it; maxStore is the server's limit
	// in force. free reads the filesystem's free space.
	base       *server.Options
	configured int64
	maxStore   atomic.Int64
	free       func(dir string) (uint64, error)
	// globalOnly: the services use the global account, whose limit
	// watchStorage may lower (no accounts configured).
	globalOnly bool
	// Owned by watchStorage: the account limit it set (0: none), and
	// whether it said it cannot set one.
	accountMax     int64
	warnedAccounts bool
	stop           chan struct{}
	stopOnce       sync.Once
	watched        chan struct{}
}

// Start checks the store directory, starts the server and waits until it
// accepts connections. It refuses a host that is not loopback when the
// server would let clients in without authentication.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts, err := cfg.options()
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if err := CheckStoreDir(opts.StoreDir); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	free := cfg.freeSpace
	if free == nil {
		free = freeBytes
	}
	configured := opts.JetStreamMaxStore
	if err := sizeStore(opts, free, log); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	base := opts.Clone()
	listen := net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port))
	if opts.Port == server.RANDOM_PORT {
		listen = net.JoinHostPort(opts.Host, "(a free port)")
	}
	if !IsLoopback(opts.Host) {
		if err := requireAuth(opts); err != nil {
			return nil, fmt.Errorf("embedded nats: listen %s: %w", listen, err)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	tail := newLogTail(log.With("component", "nats-server"), logTailLines)
	ns.SetLoggerV2(tail, false, false, false)
	ns.Start()
	if err := waitReady(ns, tail); err != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, fmt.Errorf("embedded nats on %s (store %s): %w", listen, opts.StoreDir, err)
	}
	s := &Server{ns: ns, opts: opts, storeDir: opts.StoreDir, log: log,
		base: base, configured: configured, free: free,
		globalOnly: len(opts.Accounts) == 0 && len(opts.TrustedOperators) == 0 && len(opts.TrustedKeys) == 0,
		stop:       make(chan struct{}), watched: make(chan struct{})}
	s.maxStore.Store(opts.JetStreamMaxStore)
	check := cfg.StorageCheck
	if check == 0 {
		check = DefaultStorageCheck
	}
	go s.watchStorage(check)
	return s, nil
}

// options builds nats-server's options: the config file's, if any, with
// this Config's settings over them.
func (c Config) options() (*server.Options, error) {
	opts := &server.Options{}
	if c.ConfigFile != "" {
		var err error
		opts, err = server.ProcessConfigFile(c.ConfigFile)
		if err != nil {
			return nil, fmt.Errorf("config file %s: %w", c.ConfigFile, err)
		}
	}
	if c.Host != "" {
		opts.Host = c.Host
	}
	if opts.Host == "" {
		// nats-server's own default is every interface.
		opts.Host = "127.0.0.1"
	}
	if c.Port != 0 {
		opts.Port = c.Port
	}
	if c.StoreDir != "" {
		opts.StoreDir = c.StoreDir
	}
	if opts.StoreDir == "" {
		return nil, fmt.Errorf("config file %s: jetstream store_dir: required (or a data dir)", c.ConfigFile)
	}
	if c.ServerName != "" && opts.ServerName == "" {
		opts.ServerName = c.ServerName
	}
	switch {
	case c.MaxMemory > 0:
		opts.JetStreamMaxMemory = c.MaxMemory
	case opts.JetStreamMaxMemory <= 0:
		opts.JetStreamMaxMemory = DefaultMaxMemory
	}
	switch {
	case c.MaxStore > 0:
		opts.JetStreamMaxStore = c.MaxStore
	case opts.JetStreamMaxStore <= 0:
		opts.JetStreamMaxStore = DefaultMaxStore
	}
	opts.JetStream = true
	opts.NoSigs = true
	// Start's logger collects the lines; Trace and Debug stay off.
	opts.NoLog = false
	opts.MaxPayload = max(opts.MaxPayload, MaxPayload)
	if c.Credentials != nil {
		opts.Nkeys = append(opts.Nkeys, c.Credentials.nkeyUsers()...)
	}
	return opts, nil
}

// IsLoopback reports whether a listen host reaches this machine only:
// localhost or a loopback address. Empty, 0.0.0.0 and :: are every
// interface; any other name is treated as reaching beyond the host.
func IsLoopback(host string) bool {
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// requireAuth fails unless the options make clients authenticate.
func requireAuth(opts *server.Options) error {
	if opts.NoAuthUser != "" {
		return fmt.Errorf("no_auth_user %q lets clients in without credentials; remove it, or listen on 127.0.0.1", opts.NoAuthUser)
	}
	switch {
	case len(opts.Users) > 0, len(opts.Nkeys) > 0, opts.Username != "", opts.Authorization != "",
		len(opts.TrustedOperators) > 0, len(opts.TrustedKeys) > 0, opts.TLSVerify,
		opts.AuthCallout != nil, opts.CustomClientAuthentication != nil:
		return nil
	}
	return errors.New("not loopback, and the server would accept clients without credentials: " +
		"give a NATS config with users (such as deploy/nats/standalone.conf), or generated credentials, or listen on 127.0.0.1")
}

// waitReady waits until the server accepts connections, ReadyTimeout at
// most, and fails at once when it logs a fatal error (JetStream could not
// start on its store directory, say).
func waitReady(ns *server.Server, tail *logTail) error {
	deadline := time.Now().Add(ReadyTimeout)
	for {
		if ns.ReadyForConnections(readyPoll) {
			return nil
		}
		if tail.fatal() {
			return fmt.Errorf("not ready: %s", tail.lines())
		}
		if time.Now().After(deadline) {
			if lines := tail.lines(); lines != "" {
				return fmt.Errorf("not ready after %s; its last errors: %s", ReadyTimeout, lines)
			}
			return fmt.Errorf("not ready after %s", ReadyTimeout)
		}
	}
}

// ClientURL is the URL the processes on this host dial, such as
// nats://127.0.0.1:4222: a server listening on every interface is dialled
// on loopback.
func (s *Server) ClientURL() string {
	host := s.opts.Host
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if ip.To4() == nil {
			host = "::1"
		}
	}
	scheme := "nats"
	if s.opts.TLSConfig != nil {
		scheme = "tls"
	}
	port := s.opts.Port
	if a := s.Addr(); a != nil {
		port = a.Port
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(strings.Trim(host, "[]"), strconv.Itoa(port))}
	return u.String()
}

// Addr is the address the server listens on.
func (s *Server) Addr() *net.TCPAddr {
	a, _ := s.ns.Addr().(*net.TCPAddr)
	return a
}

// StoreDir is the directory the streams are kept in.
func (s *Server) StoreDir() string { return s.storeDir }

// MaxStore is JetStream's file storage limit in force: SizeStore's at
// start, raised since if the disk made room.
func (s *Server) MaxStore() int64 { return s.maxStore.Load() }

// RequiresAuth reports whether clients must authenticate.
func (s *Server) RequiresAuth() bool { return requireAuth(s.opts) == nil }

// Shutdown stops the server and waits until it has flushed its streams.
func (s *Server) Shutdown() {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.watched
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// SetCredentials makes the running server accept exactly the users of c
// (nats-server's configuration reload): a user added signs in at once, a
// removed one is disconnected. Only for a server started with
// Config.Credentials.
func (s *Server) SetCredentials(c *Credentials) error {
	if len(s.opts.Nkeys) == 0 {
		return errors.New("embedded nats: credentials: the server was not started with generated credentials")
	}
	if err := s.reload(func(opts *server.Options) { opts.Nkeys = c.nkeyUsers() }); err != nil {
		return fmt.Errorf("embedded nats: reload credentials: %w", err)
	}
	return nil
}

// reload changes what change changes in the options the server runs with,
// by a configuration reload. Reloads take the options in force, so that
// one (the credentials) does not undo another (the storage limit).
func (s *Server) reload(change func(*server.Options)) error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	opts := s.base.Clone()
	change(opts)
	if err := s.ns.ReloadOptions(opts); err != nil {
		return err
	}
	s.base = opts
	return nil
}
