package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/metrics"
)

// natsURLOrLocal is --nats-url, else the NATS server on this machine.
func (g *globals) natsURLOrLocal() string {
	if g.natsURL == "" {
		return "nats://127.0.0.1:4222"
	}
	return g.natsURL
}

// leased is what a standalone command of one leased service (kube,
// slurm-sync) gives runLeased.
type leased struct {
	role string
	// metrics registers the service's series, where --metrics-listen
	// asks for them.
	metrics func(*metrics.Metrics)
	// ready is the service's part of /readyz (the NATS connection's is
	// runLeased's).
	ready func() error
	// run runs the service on the bus until ctx ends.
	run func(context.Context, *bus.Bus) error
}

// runLeased signs in to NATS at url as the service's role, serves
// /metrics, /healthz and /readyz where --metrics-listen asks, and runs the
// service.
func runLeased(ctx context.Context, g *globals, ops *opsFlags, url string, s leased, log *slog.Logger) error {
	g.conn.Role = s.role
	bcfg := g.busConfig(url, s.role, log)
	var m *metrics.Metrics
	if ops.metricsListen != "" {
		m = metrics.New()
		bcfg.Observer = m
		s.metrics(m)
	}
	b, err := bus.Connect(ctx, bcfg)
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	if m != nil {
		srv, err := metrics.Listen(ops.metricsListen, m.Handler(func() error {
			if nc := b.Conn(); !nc.IsConnected() {
				return fmt.Errorf("nats: %s", nc.Status())
			}
			return s.ready()
		}), log)
		if err != nil {
			return err
		}
		defer func() { _ = srv.Close() }()
		log.Info("metrics endpoint ready", "addr", srv.Addr().String(), "paths", "/metrics /healthz /readyz")
	}
	return s.run(ctx, b)
}
