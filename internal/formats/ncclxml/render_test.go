package ncclxml

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/textout"
	"github.com/toposched/toposched/internal/topology"
)

// render prints a node for the golden files: its devices, then the GPU×GPU
// and GPU×NIC matrix in nvidia-smi's shape, then its warnings.
func render(n *topology.Node) string {
	var b strings.Builder
	fmt.Fprintf(&b, "source: %s\n", n.Source)
	fmt.Fprintf(&b, "GPUs: %d  NICs: %d  NVSwitches: %d  NVLink gen: %d  PCIe gen: %d\n\n",
		len(n.GPUs), len(n.NICs), n.NVSwitches, n.NVLinkGen, n.PCIeGen)
	if n.CPU != (topology.CPU{}) {
		fmt.Fprintf(&b, "CPU: %s (%s %q family %d model %d)\n\n", n.CPU.Kind(), n.CPU.Arch, n.CPU.Vendor, n.CPU.Family, n.CPU.Model)
	}
	// Into b, a strings.Builder: no write, so no flush, can fail.
	tw := textout.Table(&b, 0, 4, 2, ' ', 0)
	tw.Println("GPU\tbus id\tNUMA\tCPU affinity")
	for _, g := range n.GPUs {
		tw.Printf("GPU%d\t%s\t%s\t%s\n", g.Index, dash(g.BusID), numa(g.NUMA), dash(g.CPUAffinity))
	}
	_ = tw.Flush()
	if len(n.NICs) > 0 {
		b.WriteString("\n")
		tw.Println("NIC\tname\tbus id\tNUMA\tGb/s\tRDMA")
		for k, nic := range n.NICs {
			rate := "-"
			if nic.RateGbps > 0 {
				rate = strconv.FormatFloat(nic.RateGbps, 'f', -1, 64)
			}
			rdma := "no"
			if nic.RDMA {
				rdma = "yes"
			}
			tw.Printf("NIC%d\t%s\t%s\t%s\t%s\t%s\n", k, nic.Name, dash(nic.BusID), numa(nic.NUMA), rate, rdma)
		}
		_ = tw.Flush()
	}
	b.WriteString("\n")
	header := []string{""}
	for i := range n.GPUs {
		header = append(header, "GPU"+strconv.Itoa(i))
	}
	for k := range n.NICs {
		header = append(header, "NIC"+strconv.Itoa(k))
	}
	tw.Println(strings.Join(header, "\t"))
	for i := range n.GPUs {
		row := []string{"GPU" + strconv.Itoa(i)}
		for j := range n.GPUs {
			row = append(row, n.GPUPaths[i][j].String())
		}
		for k := range n.NICs {
			row = append(row, n.NICPaths[i][k].String())
		}
		tw.Println(strings.Join(row, "\t"))
	}
	_ = tw.Flush()
	if len(n.Warnings) > 0 {
		b.WriteString("\nwarnings:\n")
		for _, w := range n.Warnings {
			fmt.Fprintf(&b, "  - %s\n", w)
		}
	}
	return b.String()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func numa(v int) string {
	if v < 0 {
		return "-"
	}
	return strconv.Itoa(v)
}
