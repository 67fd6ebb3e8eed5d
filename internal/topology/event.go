package topology

import (
	"errors"
	"fmt"

	"github.com/toposched/toposched/events"
)

// Event renders the node's topology into the wire form of topology.node.
// Name, position, labels and health are the caller's to fill.
func (n *Node) Event() events.TopologyNode {
	ev := events.TopologyNode{
		Name:       n.Name,
		GPUs:       make([]events.GPU, len(n.GPUs)),
		NVSwitches: n.NVSwitches,
		NVLinkGen:  n.NVLinkGen,
		PCIeGen:    n.PCIeGen,
		Source:     n.Source,
		Warnings:   n.Warnings,
		Inferred:   n.Inferred,
	}
	for i, g := range n.GPUs {
		ev.GPUs[i] = events.GPU{Index: g.Index, UUID: g.UUID, BusID: g.BusID, Model: g.Model,
			MemoryMiB: g.MemoryMiB, NUMA: numaPtr(g.NUMA), CPUAffinity: g.CPUAffinity, MIG: g.MIG}
	}
	for _, nic := range n.NICs {
		ev.NICs = append(ev.NICs, events.NIC{Name: nic.Name, BusID: nic.BusID, RateGbps: nic.RateGbps,
			RDMA: nic.RDMA, Transport: nic.Transport, NUMA: numaPtr(nic.NUMA)})
	}
	ev.GPUPaths = renderLinks(n.GPUPaths)
	ev.NICPaths = renderLinks(n.NICPaths)
	if n.P2P != nil {
		ev.P2P = make([][]string, len(n.P2P))
		for i, row := range n.P2P {
			ev.P2P[i] = make([]string, len(row))
			for j, s := range row {
				ev.P2P[i][j] = s.String()
			}
		}
	}
	if n.CPU != (CPU{}) {
		ev.CPU = &events.CPU{Arch: n.CPU.Arch, Vendor: n.CPU.Vendor, Family: n.CPU.Family, Model: n.CPU.Model}
	}
	return ev
}

// FromEvent reads a node's topology from its topology.node event. A node
// reported without paths (a plain cluster-file entry) has none: Paths is
// nil and placement treats its GPUs as reachable only over PCIe.
func FromEvent(ev events.TopologyNode) (*Node, error) {
	n := &Node{Name: ev.Name, NVSwitches: ev.NVSwitches, NVLinkGen: ev.NVLinkGen, PCIeGen: ev.PCIeGen,
		Source: ev.Source, Warnings: ev.Warnings, Inferred: ev.Inferred}
	for _, g := range ev.GPUs {
		n.GPUs = append(n.GPUs, GPU{Index: g.Index, UUID: g.UUID, BusID: g.BusID, Model: g.Model,
			MemoryMiB: g.MemoryMiB, NUMA: numaOf(g.NUMA), CPUAffinity: g.CPUAffinity, MIG: g.MIG})
	}
	for k, nic := range ev.NICs {
		n.NICs = append(n.NICs, NIC{Index: k, Name: nic.Name, BusID: nic.BusID, RateGbps: nic.RateGbps,
			RDMA: nic.RDMA, Transport: nic.Transport, NUMA: numaOf(nic.NUMA)})
	}
	var errs []error
	var err error
	if n.GPUPaths, err = parseLinks(ev.GPUPaths); err != nil {
		errs = append(errs, fmt.Errorf("gpu_paths: %w", err))
	}
	if n.NICPaths, err = parseLinks(ev.NICPaths); err != nil {
		errs = append(errs, fmt.Errorf("nic_paths: %w", err))
	}
	if ev.P2P != nil {
		n.P2P = make([][]P2PStatus, len(ev.P2P))
		for i, row := range ev.P2P {
			n.P2P[i] = make([]P2PStatus, len(row))
			for j, s := range row {
				if n.P2P[i][j], err = ParseP2PStatus(s); err != nil {
					errs = append(errs, fmt.Errorf("p2p[%d][%d]: %w", i, j, err))
				}
			}
		}
	}
	if ev.CPU != nil {
		n.CPU = CPU{Arch: ev.CPU.Arch, Vendor: ev.CPU.Vendor, Family: ev.CPU.Family, Model: ev.CPU.Model}
	}
	if len(errs) == 0 && n.GPUPaths != nil {
		if err := n.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("topology of node %s: %w", ev.Name, err)
	}
	return n, nil
}

func numaPtr(n int) *int {
	if n < 0 {
		return nil
	}
	return &n
}

func numaOf(p *int) int {
	if p == nil {
		return -1
	}
	return *p
}

func renderLinks(m [][]Link) [][]string {
	if m == nil {
		return nil
	}
	out := make([][]string, len(m))
	for i, row := range m {
		out[i] = make([]string, len(row))
		for j, l := range row {
			out[i][j] = l.String()
		}
	}
	return out
}

func parseLinks(m [][]string) ([][]Link, error) {
	if m == nil {
		return nil, nil
	}
	out := make([][]Link, len(m))
	for i, row := range m {
		out[i] = make([]Link, len(row))
		for j, s := range row {
			l, err := ParseLink(s)
			if err != nil {
				return nil, fmt.Errorf("[%d][%d]: %w", i, j, err)
			}
			out[i][j] = l
		}
	}
	return out, nil
}
