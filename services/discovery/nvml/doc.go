// Package nvml discovers a node's topology from NVIDIA's management library
// (NVML, through github.com/NVIDIA/go-nvml) and sysfs, and watches the
// health of its GPUs and NVLinks.
//
// It is the only package of toposched that imports go-nvml, and it is built
// only with the build tag nvml and cgo:
//
//	CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go build -tags nvml ./cmd/toposched
//	CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" go test -tags nvml ./services/discovery/nvml/
//
// Why a tag: go-nvml is cgo, and gcc warns of every deprecated NVML call it
// compiles (nvml.h marks them deprecated; go-nvml's own #cgo flags do not
// silence that, and nothing in a module can set another package's C
// flags), about 150 lines on a fresh build cache. Left in the default
// build, those lines would greet whoever runs the README's `go run
// ./cmd/toposched demo` or `go test ./...`, neither of which needs NVML.
// Without the tag this file is the whole package, toposched agent says how
// to get NVML, and the rest of the tree needs no C compiler. The image
// deploy/Dockerfile builds, what GPU nodes run, has the tag; .ci/run and
// make test run this package's tests with it. CGO_CFLAGS above silences
// the warnings.
//
// The library itself, libnvidia-ml.so.1, is only dlopen'ed when NVML is
// initialised, so the package builds and its tests run on machines without
// an NVIDIA driver.
//
// # Discovery
//
//	node, err := nvml.Discover(nvml.Library(), nvml.Options{NodeName: "gpu-a1"})
//
// Discover fills a topology.Node: each GPU's index, UUID, model, memory,
// PCI bus id, NUMA node, CPU affinity and MIG mode; the GPU×GPU matrix; the
// P2P matrix (GetP2PStatus, read and write, as NCCL checks them); the
// RDMA NICs found in sysfs and the GPU×NIC matrix. A GPU's NUMA node is
// its PCI device's numa_node in sysfs, the CPU side's node that the NICs'
// compare with; NVML's GetNumaNodeId, which names the GPU's own memory node
// where GPU memory is a NUMA node (Grace Hopper), is only the fallback. Its
// CPU list is NVML's GetCpuAffinity, else the device's local_cpulist.
//
// GPU pairs joined by NVLink are NV#, whether the links run directly
// between them or through NVSwitches: on an NVSwitch machine every GPU's
// links end on switches, and two GPUs on the switches are NV(min of their
// switch link counts), NV12 on a DGX A100 and NV18 on an HGX H100/H200, as
// nvidia-smi and NCCL see it (an allocator that reads only the remote end
// of each link sees a switch, not the peer, and scores no NVLink). Other
// pairs take NVML's common PCIe ancestor: X (internal, only on the
// diagonal; between two GPUs of one board it becomes PIX), PIX, PXB, PHB,
// NODE, SYS.
//
// NICs come from /sys/class/infiniband under Options.SysfsRoot; their path
// to each GPU from the two devices' places in the PCI tree under
// /sys/devices: behind one PCIe switch PIX, behind several PXB, only the
// root complex in common PHB, different root complexes on one NUMA node
// NODE, else SYS.
//
// # Initialisation
//
// Discover and WatchHealth initialise NVML themselves and shut it down when
// they return; NVML counts initialisations, so a caller that holds NVML
// open already may call them too. Where libnvidia-ml.so.1 is missing they
// return an error wrapping ErrNVMLNotAvailable, never panic.
//
// # Health
//
// WatchHealth registers every GPU for NVML's critical-XID events and polls
// NVLink states, and reports what changes as events.TopologyHealth: a
// critical XID (CriticalXIDs) makes a GPU unhealthy, a link going down makes
// component nvlink, id "<gpu index>/<link>", unhealthy, and coming back
// healthy again.
//
// # Testing without a GPU
//
// The tests run on go-nvml's mock servers (mock/dgxa100, mock/dgxh100),
// which model GPUs but no fabric: the tests inject the NVLink states and
// remote ends, common ancestors, PCI bus ids, NUMA nodes and CPU affinities
// of a DGX A100, an HGX H100, a PCIe-only box and a box with NVLink bridges,
// and build a fake sysfs tree in a temporary directory. Mock methods left
// unset panic in go-nvml; this package reads such a panic as
// ERROR_NOT_SUPPORTED (what an older driver answers), so a test sets only
// what it needs.
//
// On a machine with NVIDIA GPUs, check discovery against the real library:
//
//	TOPOSCHED_REAL_NVML=1 go test -tags nvml -run TestRealGPU -v ./services/discovery/nvml/
//
// It prints the node's matrix as topoctl would; compare with
// `nvidia-smi topo -m`.
package nvml
