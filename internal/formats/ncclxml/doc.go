// Package ncclxml imports and exports NCCL's topology XML, the file NCCL
// writes with NCCL_TOPO_DUMP_FILE and reads with NCCL_TOPO_FILE:
//
//	<system version="1">
//	  <cpu numaid="0" affinity="00000000,00ffffff" arch="x86_64" ...>
//	    <pci busid="0000:03:00.0" class="0x060400" ...>          a PCIe switch
//	      <pci busid="0000:06:00.0" class="0x030200" ...>        a GPU
//	        <gpu dev="0" sm="70" rank="0" gdr="1">
//	          <nvlink target="0000:07:00.0" count="1" tclass="0x030200"/>
//	        </gpu>
//	      </pci>
//	      <pci busid="0000:05:00.0" class="0x020700" ...>        a NIC
//	        <nic><net name="mlx5_0" dev="0" speed="100000" gdr="1" .../></nic>
//	      </pci>
//	    </pci>
//	    <nic><net name="eth0" .../></nic>                        a NIC on the CPU
//	  </cpu>
//	</system>
//
// Parse builds a topology.Node; Export writes XML for a set of a node's
// GPUs, so that a launcher (in a VM, say, whose own view of the PCI tree is
// flat) can hand NCCL the host's topology.
//
// # Devices
//
// As in NCCL, a <pci> with a <gpu> child is a GPU and one with a <nic>
// child is a NIC. Files written for NCCL_TOPO_FILE often leave devices
// bare for NCCL to fill in at run time; then the class decides: 0x03xxxx
// (of NVIDIA, or of no vendor given) is a GPU, 0x02xxxx a NIC, 0x068000 an
// NVSwitch, a 0x0600xx holding devices a host bridge, any other element
// holding devices a PCIe switch or bridge; other leaves are ignored. A GPU
// or NIC may not hold other devices.
//
// GPUs come in `dev` order when every GPU gives its dev (two GPUs with one
// dev are an error), else in bus id order. Bus ids are written in sysfs's form (0000:07:00.0). A GPU's
// NUMA node and CPU affinity are its <cpu>'s numaid and affinity mask, as
// given (NCCL's hex words; -1 and "" when absent).
//
// Each <net> is a NIC: RateGbps is speed (Mb/s) / 1000; RDMA is set by
// gdr="1", by an RDMA device name (mlx5_*, mlx4_*, bnxt_re*, irdma*, efa*,
// ...), or by its pci: class 0x0207xx (InfiniBand) or vendor 0x15b3
// (Mellanox/NVIDIA). A NIC pci without <net> gets a name made up in bus id
// order (mlx5_N for InfiniBand or Mellanox devices, else nicN), with a
// warning. NICs come in net `dev` order when every NIC gives a distinct
// dev, else in bus id order.
//
// # PCIe classes
//
// The path between two devices (a GPU and a GPU, or a GPU and a NIC) is
// classified from the tree as nvidia-smi would print it:
//
//	SYS   different <cpu> elements (across the SMP interconnect).
//	PIX   the same parent switch: at most one bridge between them.
//	PXB   a common switch further up: several bridges, no host bridge.
//	PHB   the path crosses a host bridge: a 0x0600xx element between
//	      them, or a NIC right under the <cpu> (it hangs off the CPU
//	      itself), or the common ancestor is the <cpu> and the two
//	      top-level devices under it sit on the same bus (same domain and
//	      bus number: one root bus, as in a flat VM, or one root port).
//	NODE  the common ancestor is the <cpu> and the top-level devices are on
//	      different buses: different root ports, which on server CPUs are
//	      different host bridges of one NUMA node.
//
// NCCL itself has no NODE: it calls every path through a CPU PHB. The XML
// does not record root complexes, so the PHB/NODE split uses the bus of
// the top-level device (NCCL writes the device below the root port there):
// a desktop board whose GPUs sit on separate root ports of one root
// complex shows NODE here where nvidia-smi prints PHB.
//
// # NVLink
//
// An <nvlink> to another GPU of the file (tclass 0x03xxxx, or no tclass
// and a GPU's bus id) links the pair with count NVLinks, summed over
// repeated elements; where the two GPUs disagree on the count the smaller
// is taken, with a warning. Links to NVSwitches (tclass 0x068000, or a
// target that is an NVSwitch pci or NCCL's placeholder fffffff:ff:ff.0) add
// up per GPU, NCCL merging all switches into one; two GPUs that both reach
// switches are NV min(count_a, count_b), and NVSwitches counts the
// distinct switch bus ids (0 when only the placeholder is given). A pair
// with both takes the larger. GPUs without NVLink of their own but with
// NVLink to a common third GPU are NVB, as NCCL routes through it. NVLinks
// to the CPU (tclass 0x068001), to the GPU itself (as some Azure files
// write) and to GPUs not in the file (NCCL lists them for a
// CUDA_VISIBLE_DEVICES subset, and ignores them) are ignored with a
// warning; a target that is neither GPU nor NVSwitch is an error.
// NVLinkGen comes from the GPUs' sm.
//
// Where a file has no NVLink at all (NCCL detects it at run time, and
// cloud images' files leave it out), Parse says so in Node.Warnings and
// adds NVLink only as Options say: NVLinks makes every pair NV<NVLinks>;
// NVLinkFromModel looks the model (Options.GPUModel, or the PCI device id
// the file gives) up in a small table of NVSwitch boards.
//
// A host interface with no PCI device of its own (tunl0, a Docker bridge,
// a Calico veth) is listed under every CPU on hosts that have them; it is
// one NIC, kept at its first <nic>, with a warning naming every line. The
// same name on two PCI devices is an error.
//
// # Errors
//
// Errors name the file, the line and what was expected. A document cut
// short (the `*.partial.*` files of the project's test data) is refused
// with the elements left open, innermost first, down to <system>; text
// before the root (a fragment) or inside elements is refused too. Elements
// this package does not know are skipped with a warning (<c2c> and
// <pcilink> among them: they do not change the classes above).
//
// # Export
//
// Export rebuilds a tree from the node alone, so it works for a node from
// any source that has PCI bus ids, and for any subset of its GPUs. The
// classes of the matrix nest (same switch ⊂ same top-level device ⊂ same
// host bridge ⊂ same cpu), so the devices are grouped level by level,
// joining two only where the node says their path is that close (NVLink
// hides a GPU pair's PCIe class: such pairs join nothing), and groups of
// one NUMA node with nothing SYS between them and one CPU affinity share a
// cpu. Each cpu then gets, per host-bridge group, one made-up bus
// (ffff:ff, ffff:fe, ...) on which every top-level group is a made-up
// switch (class 0x060400, like the bridges of Azure's files), holding its
// devices, or one switch per PIX group where there are several. NICs of
// one bus id share a pci; a NIC without bus id that is PHB or SYS to every
// GPU is written right under its cpu, as NCCL does. NVLink is written as
// links to NVSwitches when the node has NVSwitches or a GPU has more NV
// links to its peers than the 18 any GPU has, else as direct links per NV
// pair; the node's NVSwitches are written as pci devices of class
// 0x068000 (NCCL ignores them) that the links point to.
//
// Parse reads the first <cpu>'s arch, vendor, familyid and modelid into
// the node's CPU, from which the cost model takes NCCL's P2P level and
// inter-socket bandwidth.
//
// Export leaves to NCCL what the node does not hold: sm, gdr and rank of
// GPUs, the NICs' port and guid, link widths (the made-up switches say x16)
// and the CPUs' vendor and model (NCCL reads its own CPU, and a file for
// another host's would mislead it). It writes the node's bus ids: a VM whose
// passthrough devices have other addresses needs them mapped first. The
// node keeps no NIC link layer, so RDMA NICs are written as class 0x020700
// (InfiniBand) and others as 0x020000. Read back, the file gives the same
// GPUs, NICs, matrices, NVSwitches and PCIe generation; not the NVLink
// generation (that would take sm, which steers NCCL's tuning and is best
// left to NCCL to detect). Export reads its output back and refuses a node
// whose matrix no PCI tree reproduces.
package ncclxml
