// Package fabric reads network fabric descriptions written by other tools
// and turns them into an events.TopologyFabric: every switch with its tier
// (leaf, spine or core), the nodes directly below each leaf, and the
// switches directly below every other switch.
//
// Two sources are read:
//
//   - ParseSlurm: a Slurm topology.conf for the topology/tree plugin
//     (SwitchName lines) or the topology/block plugin (BlockName and
//     BlockSizes lines).
//   - ParseClosCSV: a three-tier Clos table with one row per host naming its
//     ToR (ASW), aggregation (PSW) and core (DSW) switch, as in Alibaba's
//     Lingjun 2023 dataset.
//
// Both return the fabric with Cluster left empty: the file does not name the
// cluster, so the caller sets it. Errors name the file and line and say what
// was expected ("topology.conf:3: Nodes: expected ..., got ..."); every
// problem found is reported, joined with errors.Join, in line order.
//
// # Slurm topology.conf
//
// The file syntax is Slurm's configuration syntax: parameter names are case
// insensitive; "#" starts a comment (an escaped "\#" does not); a line ending
// in an odd number of backslashes continues on the next line (the backslash
// is dropped and the lines are joined as is, as Slurm's parser does); "\x"
// reads as "x"; a value may be double-quoted; "Key = value" is accepted.
// Node and switch lists are hostlist expressions (see ExpandHostlist); the
// whole file may expand to at most MaxHostlistNames names. Node names must
// be host names as the cluster file accepts them (letters, digits, '.', '_',
// '-'); switch names may also hold ':' and are at most 64 characters, as in
// Slurm. A name listed twice under one switch is kept once.
//
// topology/tree: a line is SwitchName=<name> followed by Nodes=<hostlist>
// (a leaf), or Switches=<hostlist> (a switch above other switches), and an
// optional LinkSpeed=<n> which is checked and then ignored, as Slurm ignores
// it. A switch with both Nodes and Switches is an error (Slurm refuses it
// too); a switch with neither is an empty leaf (as in Slurm). The tier of a
// switch comes from its height in the tree: height 0 (it has nodes) is leaf,
// height 1 is spine, 2 and more is core, where the height of a switch is one
// more than the greatest height of its children. Every switch named in
// Switches= must be defined in the file, the switch graph must have no
// cycle, and switch names are unique. Slurm only warns about a node below
// two leaves, and so does ParseSlurm: the node stays below the first leaf
// and is dropped from the later one, and Warnings of the result
// names the node, both switches and their lines (a real file, the DGX-2
// SuperPOD "circe" topology.conf, lists circe-n051 under two switches). A
// switch may be listed under several parents. Several top-level switches (islands, as in a file with a
// main switch and a few single-node switches) are returned as they are: the
// scheduler treats separate trees as not connected.
//
// topology/block: each BlockName=<name> Nodes=<hostlist> becomes a switch of
// tier leaf with those nodes, and no switch is put above the blocks, so each
// block is an island of its own. BlockSizes is checked as Slurm checks it
// (positive sizes, each a power-of-two multiple of the first, the first at
// most the node count of every block) but it is not represented: the event
// has no way to say which blocks may be joined into larger blocks. Without
// BlockSizes every block must have at least as many nodes as the first, as
// Slurm requires. A node in two blocks is an error.
//
// topology/ring (RingName lines) is refused with an error naming each ring
// line: a ring has no tree to describe. A file that mixes SwitchName lines
// with BlockName or BlockSizes lines is refused as well, as Slurm's plugins
// refuse each other's keys; the SchedMD man page example that shows all
// three layouts in one file is therefore an error as a whole.
//
// # Clos CSV
//
// The header must have the columns ip, DSW, PSW and ASW (names matched case
// insensitively, in any order; other columns are ignored). Each row is one
// host: the ip cell names the node, ASW its leaf (ToR), PSW the spine
// (aggregation) above that leaf, DSW the core above that spine. ASW labels
// are local to their PSW: the Lingjun data numbers ToRs S1, S2, ... afresh
// under each PSW, and no (PSW, ASW) pair has more than 8 hosts while the same
// ASW label recurs under every PSW. A leaf is therefore named "<PSW>/<ASW>"
// (for example "P10/S14"), so ToRs of different aggregation groups are not
// merged into one. A spine keeps its PSW name and is listed under every core
// that rows pair it with (in a Clos fabric each aggregation switch connects
// to several cores); events.Switch allows a switch under several parents.
// Switches are listed core first, then spines, then leaves, each in order of
// first appearance; nodes in row order.
package fabric
