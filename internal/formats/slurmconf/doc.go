// Package slurmconf writes the Slurm configuration files that carry a
// cluster's topology to Slurm, and reads them back: gres.conf (each node's
// GPUs: device file, the cores of the GPU's NUMA node, its NVLinks to the
// node's other GPUs) and topology.conf (the network switch tree). The
// target is Slurm 22.05, Debian bookworm's, with select/cons_tres.
//
// # gres.conf
//
// WriteGres writes one Name=gpu line per GPU, in index order, so that a
// GPU's GRES index (its place among its node's lines, which
// CUDA_VISIBLE_DEVICES, --gpu-bind=map_gpu and squeue's gres_detail IDX
// use) is toposched's GPU index. Links= is the GPU's row of the node's
// NVLink matrix, which cons_tres reads to give a job GPUs that are linked
// to each other: with GPU 0 of a node busy and NVLink pairs (0,1) and
// (2,3), a job asking for two GPUs gets 2 and 3 rather than the lowest
// free, 1 and 2. Cores= is the GPU's CPU affinity as Slurm's logical core
// indices (see Options.ThreadsPerCore); Slurm prefers, and with
// --gres-flags=enforce-binding requires, those cores for a job's CPUs.
// Nodes described alike share their lines under one NodeName hostlist.
//
// The device file is Options.DeviceFormat of the index (/dev/nvidia<i>):
// NVIDIA's device minor numbers usually, not always, follow the PCI bus
// order that numbers the GPUs. Without cgroup device constraint Slurm only
// stats the file; with it a wrong minor would fence off the wrong GPU.
// Links keeps the index right either way, as Slurm orders GPUs by the
// place of -1 in Links when it merges them with what AutoDetect finds.
//
// ParseGres reads a gres.conf (see its documentation for what it checks)
// into each node's GPUs; DiffGres compares them with what discovery says.
//
// # topology.conf
//
// WriteTopology writes the fabric's switch tree for topology/tree:
// SwitchName lines with Nodes= or Switches= hostlists, leaves first.
// Slurm 22.05 has no topology/block (it came in 23.11), so multi-node
// NVLink domains are not written, and a rail-optimized node stays below
// one leaf (SlurmTree). fabric.ParseSlurm reads the file back;
// DiffTopology compares the result with the fabric.
//
// Errors of the parsers name the file, the line and the key at fault and
// say what was expected ("gres.conf:3: Links: expected ..., got ...");
// errors of the writers name the node or switch and the field.
package slurmconf
