// Package clusterfile reads the cluster file (YAML or JSON: the nodes in
// enumeration order with their GPUs, and optionally the fabric switches),
// the node topology files it names (nvidia-smi matrices, NCCL XML, toposched
// JSON), the built-in machine models, and renders a cluster as a tree, a
// Graphviz graph or a node's matrix. Discovery publishes what it reads; the
// placement engine, dry runs and the harnesses read the same files through it.
package clusterfile
