// Package discovery is the discovery service: it turns descriptions of the
// hardware into topology events. Each node's report is published on
// topology.node.<node>, the fabric on topology.fabric; the streams keep
// them, so every other service's store is a projection it can rebuild.
//
// The first source is the cluster file (internal/formats/clusterfile
// reads it); the node agent (subpackage nvml) reports live hardware.
package discovery
