package topology

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/toposched/toposched/internal/textout"
)

// WriteMatrix prints a node's matrix in nvidia-smi's shape: one row per
// GPU with its GPU and NIC columns, then one line per GPU with its NUMA
// node and nearest NIC. With bw set, each GPU pair also shows its
// bandwidth in GB/s.
func WriteMatrix(w io.Writer, n *Node, bw *Bandwidths) error {
	var b strings.Builder
	tw := textout.Table(&b, 0, 4, 2, ' ', 0)
	header := []string{""}
	for _, g := range n.GPUs {
		header = append(header, "GPU"+strconv.Itoa(g.Index))
	}
	for k := range n.NICs {
		header = append(header, "NIC"+strconv.Itoa(k))
	}
	header = append(header, "NUMA")
	tw.Println(strings.Join(header, "\t"))
	for i, g := range n.GPUs {
		row := []string{"GPU" + strconv.Itoa(g.Index)}
		for j := range n.GPUs {
			cell := n.GPUPaths[i][j].String()
			if bw != nil && i != j {
				cell += "/" + strconv.FormatFloat(n.Path(i, j, bw).BandwidthGBps, 'f', -1, 64)
			}
			row = append(row, cell)
		}
		for k := range n.NICs {
			cell := "?"
			if i < len(n.NICPaths) && k < len(n.NICPaths[i]) && n.NICPaths[i][k].Class != Unknown {
				cell = n.NICPaths[i][k].String()
			}
			row = append(row, cell)
		}
		row = append(row, numa(g.NUMA))
		tw.Println(strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(n.NICs) > 0 {
		b.WriteString("\nNICs:\n")
		for k, nic := range n.NICs {
			fmt.Fprintf(&b, "  NIC%d: %s", k, nic.Name)
			if nic.RateGbps > 0 {
				fmt.Fprintf(&b, " %g Gb/s", nic.RateGbps)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n")
	for i, g := range n.GPUs {
		fmt.Fprintf(&b, "GPU%d: NUMA %s, nearest NIC %s\n", g.Index, numa(g.NUMA), n.nearestName(i))
	}
	if bw != nil {
		b.WriteString("\nCells after / are bandwidth per direction in GB/s (defaults: topology.DefaultBandwidths).\n")
	}
	for _, inf := range n.Inferred {
		fmt.Fprintf(&b, "inferred: %s\n", inf)
	}
	for _, warn := range n.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", warn)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func numa(n int) string {
	if n < 0 {
		return "N/A"
	}
	return strconv.Itoa(n)
}

func (n *Node) nearestName(g int) string {
	k := n.NearestNIC(g)
	if k < 0 {
		return "none"
	}
	return fmt.Sprintf("%s (NIC%d, %s)", n.NICs[k].Name, k, n.NICPaths[g][k])
}

// MatrixJSON is the JSON form of a node's matrix: what `topoctl topology
// matrix --format json` prints.
type MatrixJSON struct {
	GPUs []GPUJSON `json:"gpus"`
	NICs []NIC     `json:"nics"`
	// Matrix[i] is GPU i's row: its GPU columns, then its NIC columns.
	Matrix   [][]string `json:"matrix"`
	Warnings []string   `json:"warnings,omitempty"`
}

// GPUJSON is one GPU with what placement derives for it.
type GPUJSON struct {
	GPU
	NearestNIC string `json:"nearest_nic,omitempty"`
}

// JSON returns the node's matrix in its JSON form.
func (n *Node) JSON() MatrixJSON {
	out := MatrixJSON{NICs: n.NICs, Warnings: n.Warnings}
	if out.NICs == nil {
		out.NICs = []NIC{}
	}
	for i, g := range n.GPUs {
		gj := GPUJSON{GPU: g}
		if k := n.NearestNIC(i); k >= 0 {
			gj.NearestNIC = n.NICs[k].Name
		}
		out.GPUs = append(out.GPUs, gj)
		row := make([]string, 0, len(n.GPUs)+len(n.NICs))
		for j := range n.GPUs {
			row = append(row, n.GPUPaths[i][j].String())
		}
		for k := range n.NICs {
			cell := "?"
			if i < len(n.NICPaths) && k < len(n.NICPaths[i]) && n.NICPaths[i][k].Class != Unknown {
				cell = n.NICPaths[i][k].String()
			}
			row = append(row, cell)
		}
		out.Matrix = append(out.Matrix, row)
	}
	return out
}
