package store

import (
	"fmt"
	"time"

	"github.com/toposched/toposched/internal/topology"

	"github.com/toposched/toposched/events"
)

// Node is one node of the cluster. The store never hands out a Node it
// keeps: callers get a copy, but Labels is shared and must not be modified.
type Node struct {
	Name string
	// Position is the node's place in enumeration order (the order of the
	// cluster file).
	Position int
	GPUModel string
	Labels   map[string]string
	// GPUCount is the number of GPUs in the node's latest report.
	GPUCount int
	// Topology is the node's inner topology (paths between its GPUs and
	// NICs) as its report gave it, nil when the report gave none. Shared: do
	// not modify.
	Topology *topology.Node
	// Effective is Topology with the parts DownNVLinks and DownNICs name
	// taken out (topology.Node.WithHealth): what placement is to read. It is
	// Topology itself, the same pointer, while nothing is down, and nil when
	// Topology is. The store keeps it rather than computing it on read, so a
	// read costs nothing and a snapshot holds the one its domains were
	// computed from. Shared: do not modify.
	Effective *topology.Node
	// Links is Effective's LinksKey, kept with it: two nodes with the same
	// Links and free GPUs are nodes placement cannot tell apart, and the
	// walk of a one-GPU job compares keys rather than matrices.
	Links topology.LinksKey
	// DownNVLinks lists the node's NVLinks that health reports say are down,
	// sorted by GPU index, then link; nil when none.
	DownNVLinks []NVLinkID
	// DownNICs lists the names of the node's NICs that are down, sorted;
	// nil when none. Shared: do not modify.
	DownNICs []string
}

// NVLinkID names one NVLink of a node: the GPU's index and the link's
// number on that GPU, as NVML numbers them (health id "<gpu>/<link>").
type NVLinkID struct {
	GPU  int
	Link int
}

// String returns "gpu/link".
func (l NVLinkID) String() string { return fmt.Sprintf("%d/%d", l.GPU, l.Link) }

// GPU is one GPU of a node. Its primary key is (Node, Index).
type GPU struct {
	Node         string
	Index        int
	UUID         string
	Model        string
	MemoryMiB    int
	Healthy      bool
	HealthReason string
	// JobID is the job holding the GPU; "" means free.
	JobID string
	// HeldBy names what holds the GPU outside toposched (another
	// scheduler's ResourceClaim, from topology.held); "" when nothing
	// does. A held GPU is not free, whatever JobID says.
	HeldBy string
	// NodePosition copies the node's Position.
	NodePosition int
	// NUMA is the GPU's NUMA node, -1 when its report did not say.
	NUMA int
	// Domains lists the domains the GPU belongs to, narrowest first: its
	// NVLink island, PCIe switch group, NUMA node and node, the fabric
	// domains of its node (leaf, pod, core, as UpsertFabric gave them), and
	// the cluster. A GPU its node's report no longer lists (ReasonMissing)
	// keeps only the node, fabric and cluster domains; one of a removed node
	// (ReasonNodeRemoved) has none. See Domain. Shared: do not modify.
	Domains []string
}

// Key returns the GPU's primary key.
func (g GPU) Key() GPUKey { return GPUKey{Node: g.Node, Index: g.Index} }

// Free reports whether a new job may be placed on the GPU: healthy and held
// by no job, here or outside.
func (g GPU) Free() bool { return g.Healthy && g.JobID == "" && g.HeldBy == "" }

// GPUKey names one GPU.
type GPUKey struct {
	Node  string
	Index int
}

// String returns "node/index".
func (k GPUKey) String() string { return fmt.Sprintf("%s/%d", k.Node, k.Index) }

// JobState is where a job stands in placement (events.JobState).
type JobState = events.JobState

// Job states, as Job.State holds them. They are the events package's
// JobState values under the names the store's callers have always used.
const (
	JobPending  = events.JobStatePending
	JobPlaced   = events.JobStatePlaced
	JobRejected = events.JobStateRejected
	JobFinished = events.JobStateFinished
)

// Job is a job known to placement. Spec, Decision and Reasons are shared
// with the store and must not be modified once passed to UpsertJob or read
// back.
type Job struct {
	ID       string
	State    JobState
	Priority int
	// Seq is assigned by the store when the job is first inserted; it
	// orders jobs of equal priority by age.
	Seq uint64
	// Turn orders pending jobs of equal priority ahead of Seq: the
	// earlier first, and a zero Turn before any other (placement's queue
	// order, services/placement).
	Turn     time.Time
	Spec     events.JobAnalyzed
	Decision *events.PlacementDecided
	Reasons  []events.Reason
	// WithdrawnBy is the tenant that finished the job before placement
	// saw it (events.PlacementReleased.Tenant); "" for the services.
	WithdrawnBy string
}

// Health reasons set by the store itself.
const (
	// ReasonMissing marks an allocated GPU that its node's latest report no
	// longer lists. It is kept, unhealthy, until its job releases it.
	ReasonMissing = "missing from node report"
	// ReasonNodeRemoved marks an allocated GPU of a removed node. It is
	// kept, unhealthy, until its job releases it.
	ReasonNodeRemoved = "node removed"
)

// indexEntry is a row of TableIndex: a named counter.
type indexEntry struct {
	Key   string
	Value uint64
}

// jobSeqKey names the counter behind Job.Seq.
const jobSeqKey = "job_seq"

// placedSeqKey names the counter behind Snapshot.PlacedVersion.
const placedSeqKey = "placed_seq"

// topologySeqKey names the counter behind Snapshot.TopologyVersion.
const topologySeqKey = "topology_seq"
