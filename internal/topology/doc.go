// Package topology is toposched's model of a node's hardware: its GPUs and
// NICs, the class of the best path between every two of them, and the
// bandwidth and latency such a path gives.
//
// A node keeps its own small matrix, indexed by GPU and NIC position, in
// the classes nvidia-smi and NCCL use, best first:
//
//	X     the device itself
//	NV#   # bonded NVLinks, directly or through NVSwitches: on an NVSwitch
//	      machine every GPU pair is NV#, which is what it is to NCCL (other
//	      allocators see the switch, not the peer, and score no NVLink)
//	NVB   NVLink through an intermediate GPU
//	PIX   at most one PCIe bridge
//	PXB   several PCIe bridges, no host bridge
//	PHB   a PCIe host bridge (the CPU)
//	NODE  between host bridges within a NUMA node
//	SYS   across the SMP interconnect between NUMA nodes
//	NET   through the network (between nodes)
//
// Sources (nvidia-smi output, NCCL topology XML, NVML) fill a Node; what one
// source lacks (NVLink in a cloud image's XML, a NIC row cut from a pasted
// output) is recorded in Warnings rather than invented.
package topology
