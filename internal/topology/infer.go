package topology

import (
	"fmt"
	"strings"
)

// Infer works out what the source did not say but its paths and names
// show, and records each fact in n.Inferred with what it came from, so
// that people can tell it from what was read:
//
//   - the NVLink generation, from the GPU model's name (V100: 2; A100,
//     A800: 3; H100, H200, H800, H20: 4; B100, B200, GB200: 5), or else
//     from a count on every pair of GPUs that only an NVSwitch gives: NV18
//     is NVLink 4 (H100/H200 HGX), NV12 on four GPUs or more NVLink 3
//     (A100 HGX), NV6 on sixteen NVLink 2 (DGX-2);
//   - that the GPUs reach each other through NVSwitches (the same count on
//     every pair) or over bridges (NVLink only inside pairs or quads).
//
// The cost model applies NVLS from NVLink 4 on NVSwitch nodes, so an
// nvidia-smi topo -m of an H100 node, which names no generation, no
// longer hides it. Infer changes nothing the source gave.
func Infer(n *Node) {
	inferTransports(n)
	g := len(n.GPUs)
	if g < 2 || len(n.GPUPaths) != g {
		return
	}
	count, everyPair := 0, true
	linked := make([]int, g) // NVLink peers of each GPU
	for i := range g {
		for j := range g {
			if i == j {
				continue
			}
			l := n.GPUPaths[i][j]
			if l.Class != NV {
				everyPair = false
				continue
			}
			linked[i]++
			if count == 0 {
				count = l.NVLinks
			} else if l.NVLinks != count {
				everyPair = false
			}
		}
	}
	if count == 0 {
		return // no NVLink
	}
	if n.NVLinkGen == 0 {
		if gen, model := genOfModel(n); gen > 0 {
			n.NVLinkGen = gen
			n.Inferred = append(n.Inferred, fmt.Sprintf("NVLink %d, from the GPU model %s", gen, model))
		} else if everyPair {
			switch {
			case count == 18:
				n.NVLinkGen = 4
				n.Inferred = append(n.Inferred, "NVLink 4, from NV18 on every pair of GPUs (H100/H200 through NVSwitches; a B200 also shows NV18: give the GPU model to tell)")
			case count == 12 && g >= 4:
				n.NVLinkGen = 3
				n.Inferred = append(n.Inferred, "NVLink 3, from NV12 on every pair of GPUs (A100 through NVSwitches)")
			case count == 6 && g == 16:
				n.NVLinkGen = 2
				n.Inferred = append(n.Inferred, "NVLink 2, from NV6 on every pair of 16 GPUs (DGX-2: V100 through NVSwitches)")
			}
		}
	}
	maxPeers := 0
	for _, p := range linked {
		maxPeers = max(maxPeers, p)
	}
	switch {
	case everyPair && n.NVSwitches == 0 && g > 2:
		n.Inferred = append(n.Inferred, fmt.Sprintf("NVSwitches, from NV%d on every pair of GPUs", count))
	case !everyPair && maxPeers <= 3:
		n.Inferred = append(n.Inferred, fmt.Sprintf("NVLink bridges, not NVSwitches: each GPU has NVLink to at most %d other GPUs (pairs or quads)", maxPeers))
	}
}

// inferTransports marks AWS EFA devices (efa*, and rdmap* as nvidia-smi
// and NCCL name them on p4d/p5) as TransportEFA: NCCL runs over libfabric
// there, whose efficiency is calibrated apart from InfiniBand's.
func inferTransports(n *Node) {
	var names []string
	for k := range n.NICs {
		nic := &n.NICs[k]
		if nic.Transport != "" {
			continue
		}
		if strings.HasPrefix(nic.Name, "efa") || strings.HasPrefix(nic.Name, "rdmap") {
			nic.Transport = TransportEFA
			names = append(names, nic.Name)
		}
	}
	if len(names) > 0 {
		n.Inferred = append(n.Inferred, fmt.Sprintf("EFA transport, from the NIC names %s", strings.Join(names, ", ")))
	}
}

// genOfModel is the NVLink generation the GPUs' model name implies, when
// every named GPU is of one model.
func genOfModel(n *Node) (int, string) {
	model := ""
	for _, gpu := range n.GPUs {
		switch {
		case gpu.Model == "":
		case model == "":
			model = gpu.Model
		case gpu.Model != model:
			return 0, ""
		}
	}
	m := strings.ToUpper(model)
	for _, k := range []struct {
		names []string
		gen   int
	}{
		{[]string{"GB200", "B200", "B100"}, 5},
		{[]string{"H100", "H200", "H800", "H20"}, 4},
		{[]string{"A100", "A800"}, 3},
		{[]string{"V100"}, 2},
	} {
		for _, name := range k.names {
			if strings.Contains(m, name) {
				return k.gen, model
			}
		}
	}
	return 0, ""
}
