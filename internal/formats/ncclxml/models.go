package ncclxml

import (
	"slices"
	"strings"
)

// modelNVLink is what a GPU model says about NVLink on its usual board.
type modelNVLink struct {
	links int    // NVLinks between every GPU pair; 0: none the model can vouch for
	gen   int    // NVLink generation, 0 when links is 0
	note  string // for the warning
}

// nvlinkOfModel looks a GPU model name up ("NVIDIA A100-SXM4-80GB",
// "H100 80GB HBM3", "b200"): ok is false when the model is not known. The
// table covers the boards where every GPU pair has the same NVLinks
// (NVSwitch boards); a bare data-centre name ("A100") means its SXM board.
// PCIe cards report no NVLink (a bridge, if fitted, is not in the name).
func nvlinkOfModel(model string) (m modelNVLink, ok bool) {
	norm := strings.ToUpper(model)
	norm = strings.NewReplacer("-", " ", "_", " ", "/", " ").Replace(norm)
	tokens := strings.Fields(norm)
	has := func(t ...string) bool {
		for _, x := range t {
			if slices.Contains(tokens, x) {
				return true
			}
		}
		return false
	}
	switch {
	case has("PCIE"):
		return modelNVLink{note: "a PCIe card: NVLink bridges, if fitted, do not show in the name"}, true
	case has("NVL"):
		return modelNVLink{note: "an NVL card: bridged in pairs or fours, not all pairs alike"}, true
	case has("GB300", "B300", "GB200", "B200"):
		return modelNVLink{links: 18, gen: 5, note: "NVSwitch board, NVLink 5"}, true
	case has("H200", "H100", "H20", "GH200"):
		return modelNVLink{links: 18, gen: 4, note: "NVSwitch board, NVLink 4"}, true
	case has("H800"):
		return modelNVLink{links: 8, gen: 4, note: "NVSwitch board, NVLink 4 (export variant)"}, true
	case has("A800"):
		return modelNVLink{links: 8, gen: 3, note: "NVSwitch board, NVLink 3 (export variant)"}, true
	case has("A100"):
		return modelNVLink{links: 12, gen: 3, note: "8-GPU NVSwitch board, NVLink 3 (a 4-GPU HGX A100 has NV4 between pairs instead)"}, true
	case has("V100") && has("SXM3"):
		return modelNVLink{links: 6, gen: 2, note: "DGX-2 class NVSwitch board, NVLink 2"}, true
	case has("V100") && has("SXM2"):
		return modelNVLink{note: "an SXM2 hybrid cube-mesh: NVLink differs between GPU pairs"}, true
	case has("V100", "T4", "L4", "L20", "L40", "L40S", "A10", "A10G", "A30", "A40", "4090", "4080", "5090"):
		return modelNVLink{note: "no NVLink between GPUs of this model"}, true
	}
	return modelNVLink{}, false
}

// pciDeviceModels names the GPUs the NVLink table knows by PCI device id
// (vendor 0x10de), for files that carry device="0x....".
var pciDeviceModels = map[string]string{
	"0x1db1": "Tesla V100-SXM2-16GB",
	"0x1db5": "Tesla V100-SXM2-32GB",
	"0x1db8": "Tesla V100-SXM3-32GB",
	"0x20b0": "A100-SXM4-40GB",
	"0x20b2": "A100-SXM4-80GB",
	"0x20b5": "A100 80GB PCIe",
	"0x20f1": "A100-PCIE-40GB",
	"0x2330": "H100 80GB HBM3 (SXM5)",
	"0x2331": "H100 PCIe",
	"0x2335": "H200",
	"0x2684": "GeForce RTX 4090",
	"0x2901": "B200",
}

// nvlinkGenOfSM is the NVLink generation of a GPU with the given compute
// capability (sm 80 = 8.0), 0 when the architecture has no NVLink or is not
// known.
func nvlinkGenOfSM(sm int) int {
	switch {
	case sm >= 60 && sm < 70:
		return 1
	case sm >= 70 && sm < 80:
		return 2
	case sm == 80 || sm == 86:
		return 3
	case sm >= 90 && sm < 100:
		return 4
	case sm >= 100 && sm < 110:
		return 5
	}
	return 0
}

// maxLinksPerGPU is the most NVLinks any GPU has (H100, B200: 18).
const maxLinksPerGPU = 18
