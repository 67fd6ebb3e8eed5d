package clusterfile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/internal/formats/ncclxml"
	"github.com/toposched/toposched/internal/formats/nvsmi"
	"github.com/toposched/toposched/internal/topology"
)

// NodeFileOptions say what to add where a file is silent. NCCL topology
// XML often carries no NVLink (NCCL detects it at run time): it is then
// taken from GPUModel where that model's board links every GPU pair
// alike, or from NVLinks, and never invented otherwise.
type NodeFileOptions struct {
	GPUModel string
	NVLinks  int
}

// LoadNodeFile imports one node's topology from a file, recognising the
// format from its content: a file that starts with '<' or holds NCCL's
// <system> or <pci> elements is NCCL topology XML, anything else is read as
// `nvidia-smi topo -m` output.
func LoadNodeFile(path string, opts NodeFileOptions) (events.TopologyNode, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return events.TopologyNode{}, fmt.Errorf("node topology: %w", err)
	}
	n, err := parseNodeFile(filepath.Base(path), data, opts)
	if err != nil {
		return events.TopologyNode{}, err
	}
	return n.Event(), nil
}

func parseNodeFile(name string, data []byte, opts NodeFileOptions) (*topology.Node, error) {
	if bytes.HasPrefix(bytes.TrimSpace(data), []byte("<")) ||
		bytes.Contains(data, []byte("<system")) || bytes.Contains(data, []byte("<pci ")) {
		return ncclxml.Parse(name, data, ncclxml.Options{
			NVLinkFromModel: opts.GPUModel != "", GPUModel: opts.GPUModel, NVLinks: opts.NVLinks,
		})
	}
	return nvsmi.Parse(name, data)
}
