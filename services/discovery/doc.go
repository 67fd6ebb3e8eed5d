// Package discovery turns descriptions of the hardware into topology events.
// Each node's report is published on topology.node.<node>, the fabric on
// topology.fabric; the streams keep them, so every other service's store is
// a projection it can rebuild.
//
// The first source is the cluster file (YAML or JSON): the nodes in
// enumeration order with their GPUs, and optionally the fabric switches.
package discovery
