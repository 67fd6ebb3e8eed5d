//go:build nvml && cgo

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events/bus"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/services/discovery/nvml"
	"github.com/toposched/toposched/services/launcher"
)

// runNVMLAgent discovers the node through NVML: once with --print,
// else as the agent that reports it and its health (and, with --exec,
// launches its ranks) until the command's context ends.
func runNVMLAgent(cmd *cobra.Command, g *globals, af *agentFlags, ef *execFlags) error {
	cfg := nvml.AgentConfig{
		Options:    nvml.Options{NodeName: af.node, SysfsRoot: af.sysfs},
		Position:   af.position,
		Labels:     af.labels,
		Rediscover: af.rediscover,
	}
	lib := nvml.Library()
	if af.print {
		n, err := nvml.Discover(lib, cfg.Options)
		if err != nil {
			return err
		}
		ev := n.Event()
		return clusterfile.WriteMatrix(cmd.OutOrStdout(), ev, false, true)
	}
	if ef.exec {
		if err := launcher.CheckRunAs(ef.cfg); err != nil {
			return fmt.Errorf("agent: %w", err)
		}
	}
	log, err := g.logger()
	if err != nil {
		return err
	}
	if cfg.NodeName == "" {
		// NVML's discovery names the node after the host too; the
		// name is needed first, for the node's credentials.
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node: none given and no host name: %w", err)
		}
		cfg.NodeName = h
	}
	ctx := cmd.Context()
	b, err := connectAgent(ctx, g, cfg.NodeName, log)
	if err != nil {
		return err
	}
	agent, err := nvml.NewAgent(cfg, nvml.AgentDeps{Lib: lib, Publish: b, Log: log})
	if err != nil {
		_ = b.Close()
		return err
	}
	if ef.exec {
		err = runWithLauncher(ctx, agent, b, ef, cfg.NodeName, log)
	} else if err = agent.Run(ctx); err != nil {
		err = fmt.Errorf("agent: %w", err)
	}
	// A failed drain is reported, as runServices does.
	if cerr := b.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	return err
}

// runWithLauncher runs the NVML agent and the launcher side by side; the
// first to fail stops the other.
func runWithLauncher(ctx context.Context, agent *nvml.Agent, b *bus.Bus, ef *execFlags, node string, log *slog.Logger) error {
	if node == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node: none given and no host name: %w", err)
		}
		node = h
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() {
		err := agent.Run(ctx)
		if err != nil {
			err = fmt.Errorf("agent: %w", err)
		}
		errc <- err
	}()
	// The GPUs are NVML's to report; the launcher does not check them.
	go func() { errc <- runLauncher(ctx, b, ef, node, nil, log) }()
	err := <-errc
	cancel()
	return errors.Join(err, <-errc)
}
