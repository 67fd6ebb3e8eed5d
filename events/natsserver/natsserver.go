// Package natsserver runs an embedded NATS server with JetStream, the
// default backbone of a one-process toposched and of the service tests.
//
// Clients connect over TCP loopback, not with nats.InProcessServer: pull
// consumers over in-process connections were measured to stall for 30 s in
// about one run in six (see the README's architecture notes).
package natsserver

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Config says where the server listens and keeps its streams.
type Config struct {
	// Host is the listen address; loopback unless the operator says otherwise.
	Host string
	// Port is the client port; -1 picks a free one.
	Port int
	// StoreDir holds the file-backed streams. Required: an embedded server
	// that forgets its streams on restart would lose pending jobs.
	StoreDir string
	// ServerName names the server in logs and cluster routes.
	ServerName string
	// MaxMemory and MaxStore bound JetStream; zero keeps modest defaults
	// rather than nats-server's share of the host's RAM and disk.
	MaxMemory int64
	MaxStore  int64
	// Logger receives the server's log lines; nil silences them.
	Logger *slog.Logger
}

// DefaultConfig listens on 127.0.0.1:4222.
func DefaultConfig() Config {
	return Config{Host: "127.0.0.1", Port: 4222, ServerName: "toposched"}
}

// Validate reports every problem with the configuration at once.
func (c Config) Validate() error {
	var errs []error
	if c.StoreDir == "" {
		errs = append(errs, errors.New("store dir: required"))
	}
	if c.Port < -1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d: out of range", c.Port))
	}
	return errors.Join(errs...)
}

// Server is a running embedded NATS server.
type Server struct {
	ns *server.Server
}

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.MaxMemory == 0 {
		cfg.MaxMemory = 256 << 20
	}
	if cfg.MaxStore == 0 {
		cfg.MaxStore = 8 << 30
	}
	opts := &server.Options{
		ServerName:         cfg.ServerName,
		Host:               cfg.Host,
		Port:               cfg.Port,
		JetStream:          true,
		StoreDir:           cfg.StoreDir,
		JetStreamMaxMemory: cfg.MaxMemory,
		JetStreamMaxStore:  cfg.MaxStore,
		NoSigs:             true,
		NoLog:              cfg.Logger == nil,
		// Large gangs produce decisions of a few hundred KB.
		MaxPayload: 8 << 20,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Logger != nil {
		ns.SetLoggerV2(logger{cfg.Logger.With("component", "nats-server")}, false, false, false)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded nats on %s:%d: not ready after 30s", cfg.Host, cfg.Port)
	}
	return &Server{ns: ns}, nil
}

// ClientURL is the URL clients dial, such as nats://127.0.0.1:4222.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Shutdown stops the server and waits until it has flushed its streams.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// logger adapts nats-server's logger to slog.
type logger struct{ l *slog.Logger }

func (l logger) Noticef(format string, v ...any) { l.l.Info(fmt.Sprintf(format, v...)) }
func (l logger) Warnf(format string, v ...any)   { l.l.Warn(fmt.Sprintf(format, v...)) }
func (l logger) Fatalf(format string, v ...any)  { l.l.Error(fmt.Sprintf(format, v...)) }
func (l logger) Errorf(format string, v ...any)  { l.l.Error(fmt.Sprintf(format, v...)) }
func (l logger) Debugf(format string, v ...any)  { l.l.Debug(fmt.Sprintf(format, v...)) }
func (l logger) Tracef(format string, v ...any)  { l.l.Debug(fmt.Sprintf(format, v...)) }
