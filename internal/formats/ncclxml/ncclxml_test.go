package ncclxml

import (
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/topology"
)

var update = flag.Bool("update", false, "rewrite testdata/golden")

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func testdataFiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.xml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata: %v", err)
	}
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	return files
}

func mustParse(t testing.TB, name string, opts Options) *topology.Node {
	t.Helper()
	n, err := Parse(name, readTestdata(t, name), opts)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return n
}

func link(t testing.TB, s string) topology.Link {
	t.Helper()
	l, err := topology.ParseLink(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestGolden renders every file (or its error) and its export.
func TestGolden(t *testing.T) {
	t.Parallel()
	for _, name := range testdataFiles(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var b strings.Builder
			n, err := Parse(name, readTestdata(t, name), Options{})
			if err != nil {
				b.WriteString("error: " + err.Error() + "\n")
			} else {
				b.WriteString(render(n))
				out, err := Export(n, nil)
				if err != nil {
					t.Fatalf("Export: %v", err)
				}
				b.WriteString("\n--- Export(all GPUs) ---\n")
				b.Write(out)
			}
			path := filepath.Join("testdata", "golden", name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update)", err)
			}
			if got := b.String(); got != string(want) {
				t.Errorf("%s differs from the golden file (go test -update rewrites it):\n%s", name, got)
			}
		})
	}
}

// matrix renders a node's GPU×GPU matrix, rows joined by "|".
func matrix(m [][]topology.Link) string {
	var rows []string
	for _, r := range m {
		var cells []string
		for _, l := range r {
			cells = append(cells, l.String())
		}
		rows = append(rows, strings.Join(cells, " "))
	}
	return strings.Join(rows, "|")
}

func hasWarning(n *topology.Node, sub string) bool {
	return slices.ContainsFunc(n.Warnings, func(w string) bool { return strings.Contains(w, sub) })
}

// TestHandChecked checks, per file, what was worked out by reading it.
func TestHandChecked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file  string
		check func(t *testing.T, n *topology.Node)
	}{
		{"azure-ndv4-a100_azhpc-images-topology.xml", func(t *testing.T, n *topology.Node) {
			if len(n.GPUs) != 8 || len(n.NICs) != 8 {
				t.Fatalf("%d GPUs, %d NICs, want 8 and 8", len(n.GPUs), len(n.NICs))
			}
			for k, nic := range n.NICs {
				if !strings.HasPrefix(nic.Name, "mlx5_") || !nic.RDMA {
					t.Errorf("NIC%d: %+v, want an RDMA mlx5_* NIC", k, nic)
				}
			}
			// Bus id order: 0001,0002 on cpu numaid 1 under one switch with
			// NICs 0101,0102; 0003,0004 on numaid 0; 000b,000c on 3; 000d,000e on 2.
			wantNUMA := []int{1, 1, 0, 0, 3, 3, 2, 2}
			for i, g := range n.GPUs {
				if g.NUMA != wantNUMA[i] {
					t.Errorf("GPU%d (%s) NUMA %d, want %d", i, g.BusID, g.NUMA, wantNUMA[i])
				}
			}
			if n.GPUs[0].BusID != "0001:00:00.0" || n.GPUs[0].CPUAffinity != "00000000,0000ffff,ff000000" {
				t.Errorf("GPU0 = %+v", n.GPUs[0])
			}
			for i := range 8 {
				for j := range 8 {
					want := "SYS"
					switch {
					case i == j:
						want = "X"
					case i/2 == j/2:
						want = "PIX" // two GPUs directly under one switch
					}
					if got := n.GPUPaths[i][j].String(); got != want {
						t.Errorf("GPU%d-GPU%d = %s, want %s", i, j, got, want)
					}
				}
				for k := range 8 {
					want := "SYS"
					if i/2 == k/2 {
						want = "PIX"
					}
					if got := n.NICPaths[i][k].String(); got != want {
						t.Errorf("GPU%d-NIC%d = %s, want %s", i, k, got, want)
					}
				}
			}
			if !hasWarning(n, "no NVLink in file") || n.NVLinkGen != 0 || n.PCIeGen != 4 {
				t.Errorf("warnings %q, NVLink gen %d, PCIe gen %d", n.Warnings, n.NVLinkGen, n.PCIeGen)
			}
		}},
		{"b200-8gpu-nvswitch-8x400g_modal-labs-gvisor-nccl_topo.xml", func(t *testing.T, n *topology.Node) {
			if len(n.GPUs) != 8 || len(n.NICs) != 13 {
				t.Fatalf("%d GPUs, %d NICs, want 8 and 13", len(n.GPUs), len(n.NICs))
			}
			for i := range 8 {
				for j := range 8 {
					if i != j && n.GPUPaths[i][j] != (topology.Link{Class: topology.NV, NVLinks: 18}) {
						t.Errorf("GPU%d-GPU%d = %s, want NV18", i, j, n.GPUPaths[i][j])
					}
				}
			}
			// Only the placeholder target: the switch count is not known.
			if n.NVSwitches != 0 || n.NVLinkGen != 5 || n.PCIeGen != 5 {
				t.Errorf("NVSwitches %d, NVLink gen %d, PCIe gen %d; want 0, 5, 5", n.NVSwitches, n.NVLinkGen, n.PCIeGen)
			}
			if hasWarning(n, "NVLink") {
				t.Errorf("warnings %q", n.Warnings)
			}
			nic := func(name string) (int, topology.NIC) {
				for k, c := range n.NICs {
					if c.Name == name {
						return k, c
					}
				}
				t.Fatalf("no NIC %s", name)
				return 0, topology.NIC{}
			}
			k5, m5 := nic("mlx5_5")
			if m5.RateGbps != 400 || !m5.RDMA || m5.NUMA != 0 || m5.BusID != "0002:00:00.0" {
				t.Errorf("mlx5_5 = %+v", m5)
			}
			k0, m0 := nic("mlx5_0")
			k9, m9 := nic("mlx5_9")
			if m0.RateGbps != 100 || m9.NUMA != 1 {
				t.Errorf("mlx5_0 = %+v, mlx5_9 = %+v", m0, m9)
			}
			// GPU0 sits on bus 0002:00 with the host bridge of mlx5_5..8;
			// mlx5_0..4 hang off the host bridge of bus 0000:00.
			for _, c := range []struct {
				gpu, nic int
				want     string
			}{{0, k5, "PHB"}, {3, k5, "PHB"}, {0, k0, "NODE"}, {0, k9, "SYS"}, {4, k9, "PHB"}, {4, k5, "SYS"}} {
				if got := n.NICPaths[c.gpu][c.nic].String(); got != c.want {
					t.Errorf("GPU%d-%s = %s, want %s", c.gpu, n.NICs[c.nic].Name, got, c.want)
				}
			}
		}},
		{"rtx4090-2gpu-2numa-cx4_yynil-RWKVinLLAMA-topo.xml", func(t *testing.T, n *topology.Node) {
			if got := matrix(n.GPUPaths); got != "X SYS|SYS X" {
				t.Errorf("GPU matrix %s, want SYS between the two", got)
			}
			if n.GPUs[0].NUMA != 3 || n.GPUs[1].NUMA != 2 || n.GPUs[0].CPUAffinity != "c0c0" {
				t.Errorf("GPUs %+v", n.GPUs)
			}
			if len(n.NICs) != 2 || n.NICs[0].Name != "mlx5_0" || n.NICs[1].BusID != "0000:02:00.0" ||
				n.NICs[1].RateGbps != 100 || !n.NICs[0].RDMA || n.NICs[0].NUMA != 3 {
				t.Errorf("NICs %+v", n.NICs)
			}
			// Same cpu, different root ports (bus 01 and 02).
			if got := matrix(n.NICPaths); got != "NODE NODE|SYS SYS" {
				t.Errorf("GPU-NIC matrix %s", got)
			}
			if !hasWarning(n, "no NVLink in file") {
				t.Errorf("warnings %q", n.Warnings)
			}
		}},
		{"azure-ncv4-a100-4gpu_azhpc-images-topology.xml", func(t *testing.T, n *topology.Node) {
			if len(n.GPUs) != 4 || len(n.NICs) != 1 {
				t.Fatalf("%d GPUs, %d NICs, want 4 and 1", len(n.GPUs), len(n.NICs))
			}
			if got := matrix(n.GPUPaths); got != "X SYS SYS SYS|SYS X SYS SYS|SYS SYS X SYS|SYS SYS SYS X" {
				t.Errorf("GPU matrix %s", got)
			}
			// eth0 hangs off cpu 0 itself.
			if got := matrix(n.NICPaths); got != "PHB|SYS|SYS|SYS" {
				t.Errorf("GPU-NIC matrix %s", got)
			}
			if nic := n.NICs[0]; nic.Name != "eth0" || nic.RDMA || nic.RateGbps != 100 || nic.BusID != "" || nic.NUMA != 0 {
				t.Errorf("NIC %+v", nic)
			}
			if !hasWarning(n, "to itself ignored") || !hasWarning(n, "no NVLink between GPUs in file") {
				t.Errorf("warnings %q", n.Warnings)
			}
		}},
		{"azure-ndv5-h100_azhpc-images-topology.xml", func(t *testing.T, n *topology.Node) {
			if len(n.GPUs) != 8 || len(n.NICs) != 8 || n.PCIeGen != 5 {
				t.Fatalf("%d GPUs, %d NICs, PCIe gen %d", len(n.GPUs), len(n.NICs), n.PCIeGen)
			}
			// One GPU and one NIC per switch; the switches' made-up bus ids
			// (ffff:ff:0N.0) put them on one bus: PHB across switches.
			for i := range 8 {
				for k := range 8 {
					want := "SYS"
					switch {
					case i == k:
						want = "PIX"
					case i/4 == k/4:
						want = "PHB"
					}
					if got := n.NICPaths[i][k].String(); got != want {
						t.Errorf("GPU%d-NIC%d = %s, want %s", i, k, got, want)
					}
				}
			}
		}},
		{"azure-ndv2-v100_azhpc-images-topology.xml", func(t *testing.T, n *topology.Node) {
			// Every device on a domain of its own (Hyper-V): NODE in a cpu.
			if n.GPUPaths[0][1].Class != topology.NODE || n.GPUPaths[0][4].Class != topology.SYS ||
				n.NICPaths[0][0].Class != topology.NODE || n.NICPaths[7][0].Class != topology.SYS {
				t.Errorf("GPU matrix %s, NIC matrix %s", matrix(n.GPUPaths), matrix(n.NICPaths))
			}
			if len(n.NICs) != 1 || n.NICs[0].Name != "mlx5_0" || !hasWarning(n, "without <net>") {
				t.Errorf("NICs %+v, warnings %q", n.NICs, n.Warnings)
			}
		}},
		{"pcie-8gpu-0x26ba-cx-switch-roce_alibaba-rtp-llm-topo.xml", func(t *testing.T, n *topology.Node) {
			if len(n.GPUs) != 8 || len(n.NICs) != 12 {
				t.Fatalf("%d GPUs, %d NICs", len(n.GPUs), len(n.NICs))
			}
			// NICs in net dev order: mlx5_2..5 (dev 0-3), then the bonds.
			if n.NICs[0].Name != "mlx5_2" || n.NICs[4].Name != "mlx5_bond_0" || n.NICs[11].Name != "mlx5_bond_7" {
				t.Errorf("NIC order %+v", n.NICs)
			}
			for i := range 8 {
				// Each GPU's bond shares the top switch, one level up: PXB.
				if got := n.NICPaths[i][4+i].String(); got != "PXB" {
					t.Errorf("GPU%d-mlx5_bond_%d = %s, want PXB", i, i, got)
				}
				if got := n.GPUPaths[i][(i+1)%4+i/4*4].String(); i%4 != 3 && got != "NODE" {
					t.Errorf("GPU%d and its neighbour: %s, want NODE", i, got)
				}
			}
			if n.GPUPaths[0][4].Class != topology.SYS || n.NICPaths[0][0].Class != topology.NODE || n.NICPaths[4][0].Class != topology.SYS {
				t.Errorf("GPU matrix %s", matrix(n.GPUPaths))
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			n := mustParse(t, tc.file, Options{})
			if err := n.Validate(); err != nil {
				t.Fatal(err)
			}
			if n.Source != tc.file {
				t.Errorf("Source %q", n.Source)
			}
			tc.check(t, n)
		})
	}
}

// TestPartialRefused: the cut real files are refused, naming what is
// missing.
func TestPartialRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file string
		want []string
	}{
		{"dgx-a100-40gb_nccl-issue-1505.partial.xml", []string{
			"dgx-a100-40gb_nccl-issue-1505.partial.xml:1:", "before the root element", `expected <system version="1">`,
		}},
		{"dgx1-v100-4gpu-subset_nccl-issue-671.partial.xml", []string{
			"dgx1-v100-4gpu-subset_nccl-issue-671.partial.xml:17:", "cut or broken here; unclosed <gpu> at line 13",
			`<pci busid="0000:07:00.0"> at line 12`, "<cpu numaid=0> at line 2", "<system> at line 1",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.file, readTestdata(t, tc.file), Options{})
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	// Every partial file of the test data is refused.
	for _, name := range testdataFiles(t) {
		if strings.Contains(name, ".partial.") {
			if _, err := Parse(name, readTestdata(t, name), Options{}); err == nil {
				t.Errorf("%s accepted", name)
			}
		}
	}
}

const goodHead = `<system version="1">
  <cpu numaid="0" affinity="ff">
`

func TestBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"empty", "", []string{"f.xml:1:", "empty document"}},
		{"not XML", "GPU0 X NV12\n", []string{"f.xml:1:", "before the root element"}},
		{"binary", "\x00\x01\x02", []string{"f.xml:1:"}},
		{"wrong root", `<topology><cpu/></topology>`, []string{"f.xml:1:", "root element <topology>", "expected <system"}},
		{"second root", `<system/><system/>`, []string{"after </system>"}},
		{"text after", `<system/> trailing`, []string{"after </system>"}},
		{"cut at end", goodHead + `    <pci busid="0000:01:00.0" class="0x030200">`, []string{
			"f.xml:3:", "document ends before </system>", `unclosed <pci busid="0000:01:00.0"> at line 3`, "<cpu numaid=0> at line 2", "<system> at line 1"}},
		{"unclosed cpu", "<system version=\"1\">\n  <cpu numaid=\"1\">\n</system>", []string{"f.xml:3:", "cpu"}},
		{"gpu without busid", goodHead + `<pci class="0x030200"><gpu dev="0"/></pci></cpu></system>`, []string{"f.xml:3:", "<pci> without busid"}},
		{"bad busid", goodHead + `<pci busid="gpu0" class="0x030200"/></cpu></system>`, []string{"f.xml:3:", `busid="gpu0"`, "0000:07:00.0"}},
		{"duplicate busid", goodHead + "<pci busid=\"0000:01:00.0\" class=\"0x030200\"/>\n<pci busid=\"0000:01:00.0\" class=\"0x030200\"/></cpu></system>", []string{"f.xml:4:", "already at line 3"}},
		{"no class", goodHead + `<pci busid="0000:01:00.0"><gpu/></pci></cpu></system>`, []string{"f.xml:3:", "without class"}},
		{"nvlink to unknown target", goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0"><nvlink target="0000:99:00.0" count="2"/></gpu></pci></cpu></system>`,
			[]string{"f.xml:3:", `target="0000:99:00.0"`, "no GPU of this file and no NVSwitch"}},
		{"nvlink to a NIC class", goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0"><nvlink target="0000:02:00.0" count="2" tclass="0x020700"/></gpu></pci></cpu></system>`,
			[]string{"f.xml:3:", "expected tclass"}},
		{"nvlink without count", goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu><nvlink target="0000:02:00.0"/></gpu></pci></cpu></system>`, []string{"without count"}},
		{"nvlink count 0", goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu><nvlink target="0000:02:00.0" count="0"/></gpu></pci></cpu></system>`, []string{`count="0"`, "from 1 to 64"}},
		{"gpu in cpu", goodHead + `<gpu dev="0"/></cpu></system>`, []string{"f.xml:3:", "unexpected <gpu> in <cpu numaid=0>", "belongs in <pci>"}},
		{"net outside nic", goodHead + `<pci busid="0000:01:00.0" class="0x020700"><net name="mlx5_0"/></pci></cpu></system>`, []string{"unexpected <net>"}},
		{"net without name", goodHead + `<nic><net dev="0"/></nic></cpu></system>`, []string{"<net> without name"}},
		{"duplicate net on two PCI NICs", goodHead + "<pci busid=\"0000:01:00.0\" class=\"0x020700\"><nic><net name=\"mlx5_0\"/></nic></pci>\n" +
			"<pci busid=\"0000:02:00.0\" class=\"0x020700\"><nic><net name=\"mlx5_0\"/></nic></pci></cpu></system>", []string{"f.xml:4:", "already at line 3"}},
		{"host interface also on a PCI NIC", goodHead + "<nic><net name=\"eth0\"/></nic>\n" +
			"<pci busid=\"0000:02:00.0\" class=\"0x020000\"><nic><net name=\"eth0\"/></nic></pci></cpu></system>", []string{"f.xml:4:", "already at line 3"}},
		{"bad numaid", `<system><cpu numaid="zero"/></system>`, []string{`numaid="zero"`, "integer"}},
		{"bad affinity", `<system><cpu affinity="0-7"/></system>`, []string{`affinity="0-7"`, "mask"}},
		{"bad speed", goodHead + `<nic><net name="eth0" speed="fast"/></nic></cpu></system>`, []string{`speed="fast"`}},
		{"duplicate gpu dev", goodHead + "<pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu dev=\"0\"/></pci>\n<pci busid=\"0000:02:00.0\" class=\"0x030200\"><gpu dev=\"0\"/></pci></cpu></system>",
			[]string{"f.xml:4:", "dev 0 is also the GPU of pci 0000:01:00.0"}},
		{"gpu holding a device", goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu/><pci busid="0000:02:00.0" class="0x020700"/></pci></cpu></system>`, []string{"inside the GPU"}},
		{"text in element", goodHead + "<pci busid=\"0000:01:00.0\" class=\"0x030200\">\n\n  [cut]</pci></cpu></system>", []string{"f.xml:5:", "unexpected text \"[cut]\" in <pci busid=\"0000:01:00.0\"> (line 3)"}},
		{"two hosts", `<system><cpu host_hash="0x1" numaid="0"/><cpu host_hash="0x2" numaid="1"/></system>`, []string{"host_hash", "one host"}},
		{"charset", `<?xml version="1.0" encoding="latin1"?><system/>`, []string{"f.xml:1:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, err := Parse("f.xml", []byte(tc.in), Options{})
			if err == nil {
				t.Fatalf("accepted: %+v", n)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// dockerDoc is the shape of NCCL_TOPO_DUMP_FILE on a 4-GPU, 4-NUMA
// workstation running Docker and Calico: the host's virtual interfaces
// are listed under every CPU.
const dockerDoc = `<system version="1">
  <cpu numaid="0" affinity="000000ff" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:01:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="86" rank="0" gdr="0"/>
    </pci>
    <nic>
      <net name="tunl0" dev="0" speed="10000" port="0" latency="0" guid="0x0" maxconn="65536" gdr="0"/>
      <net name="br-5f2c" dev="1" speed="10000" port="0" latency="0" guid="0x1" maxconn="65536" gdr="0"/>
    </nic>
  </cpu>
  <cpu numaid="1" affinity="0000ff00" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:21:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="1" sm="86" rank="1" gdr="0"/>
    </pci>
    <nic>
      <net name="tunl0" dev="0" speed="10000" port="0" latency="0" guid="0x0" maxconn="65536" gdr="0"/>
      <net name="br-5f2c" dev="1" speed="10000" port="0" latency="0" guid="0x1" maxconn="65536" gdr="0"/>
      <net name="cali7e0a" dev="2" speed="10000" port="0" latency="0" guid="0x2" maxconn="65536" gdr="0"/>
    </nic>
  </cpu>
  <cpu numaid="2" affinity="00ff0000" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:41:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="2" sm="86" rank="2" gdr="0"/>
    </pci>
    <nic>
      <net name="tunl0" dev="0" speed="10000" port="0" latency="0" guid="0x0" maxconn="65536" gdr="0"/>
      <net name="cali7e0a" dev="2" speed="10000" port="0" latency="0" guid="0x2" maxconn="65536" gdr="0"/>
    </nic>
  </cpu>
  <cpu numaid="3" affinity="ff000000" arch="x86_64" vendor="AuthenticAMD" familyid="23" modelid="49">
    <pci busid="0000:61:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="3" sm="86" rank="3" gdr="0"/>
    </pci>
    <nic>
      <net name="tunl0" dev="0" speed="10000" port="0" latency="0" guid="0x0" maxconn="65536" gdr="0"/>
    </nic>
  </cpu>
</system>
`

// TestRepeatedHostInterfaces: a dump that lists the same host interfaces
// under every CPU, as NCCL writes it on a host with container networks,
// imports with each interface once and a warning naming the lines; before,
// it was refused at the second copy ("the same name is already at line 7").
func TestRepeatedHostInterfaces(t *testing.T) {
	t.Parallel()
	n, err := Parse("docker.xml", []byte(dockerDoc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, nic := range n.NICs {
		names = append(names, nic.Name)
	}
	slices.Sort(names)
	if got := strings.Join(names, ","); got != "br-5f2c,cali7e0a,tunl0" {
		t.Fatalf("NICs %s, want each interface once", got)
	}
	if len(n.GPUs) != 4 {
		t.Fatalf("%d GPUs", len(n.GPUs))
	}
	for _, want := range []string{`<net name="tunl0"> is listed under 4 CPUs (lines 7, 16, 26, 35)`, `<net name="cali7e0a"> is listed under 2 CPUs (lines 18, 27)`} {
		if !hasWarning(n, want) {
			t.Errorf("no warning %q in %q", want, n.Warnings)
		}
	}
}

// classesDoc has a path of each PCIe class.
const classesDoc = `<system version="1">
  <cpu numaid="0" affinity="0000ffff">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x060400">
        <pci busid="0000:12:00.0" class="0x030200"><gpu dev="0"/></pci>
        <pci busid="0000:13:00.0" class="0x030200"><gpu dev="1"/></pci>
        <pci busid="0000:14:00.0" class="0x020700"><nic><net name="mlx5_0" dev="0" speed="200000" gdr="1"/></nic></pci>
      </pci>
      <pci busid="0000:15:00.0" class="0x060400">
        <pci busid="0000:16:00.0" class="0x030200"><gpu dev="2"/></pci>
      </pci>
    </pci>
    <pci busid="0000:20:00.0" class="0x030200"><gpu dev="3"/></pci>
    <pci busid="0000:20:00.1" class="0x020000"><nic><net name="eth1" dev="1"/></nic></pci>
    <pci busid="0000:30:00.0" class="0x060000">
      <pci busid="0000:31:00.0" class="0x030200"><gpu dev="4"/></pci>
      <pci busid="0000:32:00.0" class="0x060400">
        <pci busid="0000:33:00.0" class="0x030200"><gpu dev="5"/></pci>
      </pci>
    </pci>
    <nic><net name="eth0" dev="2" speed="25000"/></nic>
  </cpu>
  <cpu numaid="1" affinity="ffff0000">
    <pci busid="0000:80:00.0" class="0x030200"><gpu dev="6"/></pci>
  </cpu>
</system>`

// directDoc has a ring 0-1-2-3 of direct NVLinks with a 2-link pair 0-1, a
// link to a GPU outside the file, and (GPU3) a count mismatch.
const directDoc = `<system version="1">
  <cpu numaid="0">
    <pci busid="0000:06:00.0" class="0x030200"><gpu dev="0" sm="70">
      <nvlink target="0000:07:00.0" count="2" tclass="0x030200"/>
      <nvlink target="0000:09:00.0" count="1" tclass="0x030200"/>
      <nvlink target="0000:85:00.0" count="2" tclass="0x030200"/>
    </gpu></pci>
    <pci busid="0000:07:00.0" class="0x030200"><gpu dev="1" sm="70">
      <nvlink target="0000:06:00.0" count="2" tclass="0x030200"/>
      <nvlink target="0000:08:00.0" count="1"/>
    </gpu></pci>
    <pci busid="0000:08:00.0" class="0x030200"><gpu dev="2" sm="70">
      <nvlink target="0000:07:00.0" count="1" tclass="0x030200"/>
      <nvlink target="0000:09:00.0" count="1" tclass="0x030200"/>
    </gpu></pci>
    <pci busid="0000:09:00.0" class="0x030200"><gpu dev="3" sm="70">
      <nvlink target="0000:08:00.0" count="1" tclass="0x030200"/>
      <nvlink target="0000:06:00.0" count="2" tclass="0x030200"/>
    </gpu></pci>
  </cpu>
</system>`

// dgxDoc is DGX A100 style: six NVSwitches (pci devices of class 0x068000),
// two links to each from every GPU but the last, which has four.
func dgxDoc() string {
	var b strings.Builder
	b.WriteString("<system version=\"1\">\n<cpu numaid=\"0\">\n")
	for s := range 6 {
		b.WriteString(`<pci busid="0000:c` + string(rune('4'+s)) + `:00.0" class="0x068000"/>` + "\n")
	}
	for g := range 4 {
		b.WriteString(`<pci busid="0000:0` + string(rune('1'+g)) + `:00.0" class="0x030200"><gpu dev="` + string(rune('0'+g)) + `" sm="80">`)
		for s := range 6 {
			if g == 3 && s >= 4 {
				continue
			}
			b.WriteString(`<nvlink target="0000:c` + string(rune('4'+s)) + `:00.0" count="2"/>`)
		}
		b.WriteString("</gpu></pci>\n")
	}
	b.WriteString("</cpu>\n</system>\n")
	return b.String()
}

// TestClasses checks each PCIe class on a small tree.
func TestClasses(t *testing.T) {
	t.Parallel()
	n, err := Parse("classes.xml", []byte(classesDoc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"X PIX PXB NODE NODE NODE SYS",
		"PIX X PXB NODE NODE NODE SYS",
		"PXB PXB X NODE NODE NODE SYS",
		"NODE NODE NODE X NODE NODE SYS",
		"NODE NODE NODE NODE X PHB SYS",
		"NODE NODE NODE NODE PHB X SYS",
		"SYS SYS SYS SYS SYS SYS X",
	}
	if got := matrix(n.GPUPaths); got != strings.Join(want, "|") {
		t.Errorf("GPU matrix\n%s\nwant\n%s", strings.ReplaceAll(got, "|", "\n"), strings.Join(want, "\n"))
	}
	// NICs: mlx5_0 under GPU0/1's switch, eth1 a function beside GPU3 on
	// bus 20, eth0 on the CPU.
	wantNIC := "PIX NODE PHB|PIX NODE PHB|PXB NODE PHB|NODE PHB PHB|NODE NODE PHB|NODE NODE PHB|SYS SYS SYS"
	if got := matrix(n.NICPaths); got != wantNIC {
		t.Errorf("GPU-NIC matrix %s, want %s", got, wantNIC)
	}
	if n.NICs[0].RateGbps != 200 || !n.NICs[0].RDMA || n.NICs[1].RDMA || n.NICs[2].RateGbps != 25 || n.NICs[2].NUMA != 0 {
		t.Errorf("NICs %+v", n.NICs)
	}
	roundTrip(t, n, nil)
}

// TestNVLink: direct links with NVB through a third GPU, and links to
// NVSwitches.
func TestNVLink(t *testing.T) {
	t.Parallel()
	n, err := Parse("direct.xml", []byte(directDoc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "X NV2 NVB NV1|NV2 X NV1 NVB|NVB NV1 X NV1|NV1 NVB NV1 X"
	if got := matrix(n.GPUPaths); got != want {
		t.Errorf("matrix %s, want %s", got, want)
	}
	if n.NVLinkGen != 2 || n.NVSwitches != 0 || !hasWarning(n, "not a GPU of this file") || !hasWarning(n, "GPU 0000:06:00.0 lists 1 NVLinks to GPU 0000:09:00.0, which lists 2 back: took 1") {
		t.Errorf("gen %d, switches %d, warnings %q", n.NVLinkGen, n.NVSwitches, n.Warnings)
	}
	roundTrip(t, n, nil)

	n, err = Parse("dgx.xml", []byte(dgxDoc()), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want = "X NV12 NV12 NV8|NV12 X NV12 NV8|NV12 NV12 X NV8|NV8 NV8 NV8 X"
	if got := matrix(n.GPUPaths); got != want || n.NVSwitches != 6 || n.NVLinkGen != 3 {
		t.Errorf("matrix %s (want %s), NVSwitches %d, gen %d", got, want, n.NVSwitches, n.NVLinkGen)
	}
	roundTrip(t, n, nil)
	roundTrip(t, n, []int{3, 1})
}

func TestOptions(t *testing.T) {
	t.Parallel()
	const ndv5 = "azure-ndv5-h100_azhpc-images-topology.xml"
	const ncv4 = "azure-ncv4-a100-4gpu_azhpc-images-topology.xml"
	const b200 = "b200-8gpu-nvswitch-8x400g_modal-labs-gvisor-nccl_topo.xml"
	tests := []struct {
		name     string
		file     string
		opts     Options
		nv       int // every pair NV<nv>; 0: none
		gen      int
		warning  string
		bad      bool
		modelSet bool
	}{
		{"none", ndv5, Options{}, 0, 0, "pass the GPU model or --nvlinks", false, false},
		{"nvlinks", ndv5, Options{NVLinks: 18}, 18, 0, "NVLink taken from --nvlinks=18", false, false},
		{"model", ndv5, Options{NVLinkFromModel: true, GPUModel: "NVIDIA H100 80GB HBM3"}, 18, 4, `NVLink taken from GPU model "NVIDIA H100 80GB HBM3"`, false, true},
		{"nvlinks win", ndv5, Options{NVLinkFromModel: true, GPUModel: "A100-SXM4-80GB", NVLinks: 6}, 6, 0, "--nvlinks=6", false, true},
		{"pcie model", ndv5, Options{NVLinkFromModel: true, GPUModel: "NVIDIA H100 PCIe"}, 0, 0, "a PCIe card", false, true},
		{"unknown model", ndv5, Options{NVLinkFromModel: true, GPUModel: "Quantum Q9"}, 0, 0, "not in the NVLink table", false, true},
		{"model without name", ndv5, Options{NVLinkFromModel: true}, 0, 0, "no single PCI device id", false, false},
		{"model from pci id", ncv4, Options{NVLinkFromModel: true}, 0, 0, `(PCI device 0x20b5) "A100 80GB PCIe" is a PCIe card`, false, false},
		{"file has nvlink", b200, Options{NVLinks: 4}, 18, 5, "the NVLink options are ignored", false, false},
		{"negative", ndv5, Options{NVLinks: -1}, 0, 0, "", true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n, err := Parse(tc.file, readTestdata(t, tc.file), tc.opts)
			if tc.bad {
				if err == nil {
					t.Fatal("accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range n.GPUs {
				for j := range n.GPUs {
					l := n.GPUPaths[i][j]
					if i != j && (l.Class == topology.NV) != (tc.nv > 0) || (tc.nv > 0 && i != j && l.NVLinks != tc.nv) {
						t.Fatalf("GPU%d-GPU%d = %s, want NV%d", i, j, l, tc.nv)
					}
				}
			}
			if n.NVLinkGen != tc.gen || !hasWarning(n, tc.warning) {
				t.Errorf("gen %d (want %d), warnings %q (want %q)", n.NVLinkGen, tc.gen, n.Warnings, tc.warning)
			}
			if tc.modelSet != (n.GPUs[0].Model != "") {
				t.Errorf("model %q", n.GPUs[0].Model)
			}
			if tc.nv > 0 {
				roundTrip(t, n, nil)
			}
		})
	}
}

func TestNVLinkOfModel(t *testing.T) {
	t.Parallel()
	tests := []struct {
		model string
		links int
		ok    bool
	}{
		{"NVIDIA A100-SXM4-80GB", 12, true},
		{"a100", 12, true},
		{"NVIDIA A100 80GB PCIe", 0, true},
		{"NVIDIA H100 80GB HBM3", 18, true},
		{"NVIDIA H100 NVL", 0, true},
		{"NVIDIA H200", 18, true},
		{"NVIDIA H20", 18, true},
		{"NVIDIA H800", 8, true},
		{"NVIDIA A800-SXM4-80GB", 8, true},
		{"NVIDIA B200", 18, true},
		{"NVIDIA GB200", 18, true},
		{"Tesla V100-SXM3-32GB", 6, true},
		{"Tesla V100-SXM2-32GB", 0, true},
		{"NVIDIA GeForce RTX 4090", 0, true},
		{"Quadro RTX 6000", 0, false},
	}
	for _, tc := range tests {
		m, ok := nvlinkOfModel(tc.model)
		if ok != tc.ok || m.links != tc.links {
			t.Errorf("%q: %+v %v, want %d links, ok %v", tc.model, m, ok, tc.links, tc.ok)
		}
	}
}

// kept is what a round trip keeps: not Source, Warnings, Model or
// the NVLink generation.
func kept(n *topology.Node) topology.Node {
	c := *n
	// Export leaves the CPU to NCCL, which reads its own.
	c.Source, c.Warnings, c.NVLinkGen, c.CPU = "", nil, 0, topology.CPU{}
	c.GPUs = slices.Clone(n.GPUs)
	for i := range c.GPUs {
		c.GPUs[i].Model = ""
	}
	return c
}

// roundTrip exports the GPUs (nil: all), reads the file back and compares
// with the node restricted to them.
func roundTrip(t *testing.T, n *topology.Node, gpus []int) *topology.Node {
	t.Helper()
	out, err := Export(n, gpus)
	if err != nil {
		t.Fatalf("Export: %v", err)
	}
	back, err := Parse("exported.xml", out, Options{})
	if err != nil {
		t.Fatalf("exported file: %v\n%s", err, out)
	}
	want := kept(n)
	if gpus != nil {
		// As Parse makes them: empty, not nil, for no GPUs.
		want.GPUs, want.GPUPaths = nil, [][]topology.Link{}
		if want.NICPaths != nil {
			want.NICPaths = [][]topology.Link{}
		}
		for p, g := range gpus {
			gpu := n.GPUs[g]
			gpu.Index, gpu.Model = p, ""
			want.GPUs = append(want.GPUs, gpu)
			var row []topology.Link
			for _, h := range gpus {
				row = append(row, n.GPUPaths[g][h])
			}
			want.GPUPaths = append(want.GPUPaths, row)
			if n.NICPaths != nil {
				want.NICPaths = append(want.NICPaths, n.NICPaths[g])
			}
		}
		if len(gpus) == 0 {
			want.PCIeGen = 0 // carried by the GPUs
		}
	}
	got := kept(back)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip differs:\ngot\n%s\nwant\n%s\nexported:\n%s", render(&got), render(&want), out)
	}
	// A whole node exports to the same file again. (A subset need not: two
	// GPUs of an NVSwitch machine read back as NV18 with the switch count
	// unknown, and are then written as direct links.)
	if gpus == nil {
		again, err := Export(back, nil)
		if err != nil || string(again) != string(out) {
			t.Fatalf("second export differs (%v):\n%s\nfirst:\n%s", err, again, out)
		}
	}
	return back
}

// TestRoundTrip: every complete file, exported whole, reads back as the
// same node.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range testdataFiles(t) {
		if strings.Contains(name, ".partial.") {
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			roundTrip(t, mustParse(t, name, Options{}), nil)
		})
	}
}

func TestExportSubset(t *testing.T) {
	t.Parallel()
	n := mustParse(t, "b200-8gpu-nvswitch-8x400g_modal-labs-gvisor-nccl_topo.xml", Options{})
	back := roundTrip(t, n, []int{5, 4})
	if back.GPUs[0].BusID != "0003:00:02.0" || back.GPUs[1].BusID != "0003:00:01.0" || back.GPUPaths[0][1].NVLinks != 18 {
		t.Errorf("GPUs %+v, matrix %s", back.GPUs, matrix(back.GPUPaths))
	}
	roundTrip(t, n, []int{2})
	roundTrip(t, n, []int{})

	n = mustParse(t, "azure-ndv4-a100_azhpc-images-topology.xml", Options{})
	out, err := Export(n, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `<net name="mlx5_7" dev="7"/>`) || strings.Contains(string(out), "000b:00:00.0") {
		t.Errorf("export of GPU0-1 keeps all NICs and no other GPU:\n%s", out)
	}
	roundTrip(t, n, []int{0, 1})
	roundTrip(t, n, []int{7, 0, 3})
}

// TestExportOtherSource exports a node built by hand, as nvidia-smi and
// NVML give one: affinity as a cpulist, NICs with and without bus ids.
func TestExportOtherSource(t *testing.T) {
	t.Parallel()
	rows := [][]string{
		{"X", "NV12", "SYS", "SYS"},
		{"NV12", "X", "SYS", "SYS"},
		{"SYS", "SYS", "X", "PIX"},
		{"SYS", "SYS", "PIX", "X"},
	}
	nicRows := [][]string{{"PXB", "SYS", "NODE"}, {"PXB", "SYS", "NODE"}, {"SYS", "PIX", "SYS"}, {"SYS", "PIX", "SYS"}}
	n := &topology.Node{NVLinkGen: 3, PCIeGen: 4}
	for i := range 4 {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, BusID: []string{"00000000:07:00.0", "0000:0F:00.0", "0000:87:00.0", "0000:90:00.0"}[i],
			NUMA: i / 2, CPUAffinity: []string{"0-23,48-71", "24-47,72-95"}[i/2]})
		var row, nrow []topology.Link
		for _, c := range rows[i] {
			row = append(row, link(t, c))
		}
		for _, c := range nicRows[i] {
			nrow = append(nrow, link(t, c))
		}
		n.GPUPaths = append(n.GPUPaths, row)
		n.NICPaths = append(n.NICPaths, nrow)
	}
	n.NICs = []topology.NIC{
		{Index: 0, Name: "mlx5_0", BusID: "0000:0c:00.0", RateGbps: 200, RDMA: true, NUMA: 0},
		{Index: 1, Name: "mlx5_1", RateGbps: 200, RDMA: true, NUMA: 1},
		{Index: 2, Name: "ib0", RDMA: true, NUMA: -1},
	}
	out, err := Export(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse("exported.xml", out, Options{})
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if matrix(back.GPUPaths) != matrix(n.GPUPaths) || matrix(back.NICPaths) != matrix(n.NICPaths) {
		t.Errorf("matrices %s / %s\n%s", matrix(back.GPUPaths), matrix(back.NICPaths), out)
	}
	if got := back.GPUs[0].CPUAffinity; got != "000000ff,ffff0000,00ffffff" {
		t.Errorf("affinity %q", got)
	}
	if back.GPUs[0].BusID != "0000:07:00.0" || back.GPUs[1].BusID != "0000:0f:00.0" {
		t.Errorf("bus ids %+v", back.GPUs)
	}
	if !back.NICs[2].RDMA || back.NICs[2].NUMA != 0 || back.NICs[1].BusID == "" {
		t.Errorf("NICs %+v", back.NICs)
	}
}

func TestExportErrors(t *testing.T) {
	t.Parallel()
	good := func() *topology.Node {
		return mustParse(t, "rtx4090-2gpu-2numa-cx4_yynil-RWKVinLLAMA-topo.xml", Options{})
	}
	tests := []struct {
		name  string
		node  func() *topology.Node
		gpus  []int
		wants string
	}{
		{"nil", func() *topology.Node { return nil }, nil, "nil node"},
		{"out of range", good, []int{2}, "GPU position 2"},
		{"twice", good, []int{0, 0}, "given twice"},
		{"no bus id", func() *topology.Node { n := good(); n.GPUs[1].BusID = ""; return n }, nil, "GPU1 has no PCI bus id"},
		{"nameless NIC", func() *topology.Node { n := good(); n.NICs[1].Name = ""; return n }, nil, "NIC1 has no name"},
		{"invalid node", func() *topology.Node { n := good(); n.GPUPaths[0][1] = link(t, "PIX"); return n }, nil, "GPU0-GPU1"},
		{"two NUMA nodes in one cpu", func() *topology.Node {
			n := good()
			// GPU1 (NUMA 2) would share mlx5_0's switch with GPU0 (NUMA 3).
			n.NICPaths[1][0], n.NICPaths[1][1] = link(t, "PIX"), link(t, "PIX")
			return n
		}, nil, "closer than SYS"},
		{"not a tree", func() *topology.Node {
			n := mustParse(t, "azure-ndv5-h100_azhpc-images-topology.xml", Options{})
			// GPU1 joins GPU0's switch through NIC0, but stays PHB to GPU0.
			n.NICPaths[1][0] = link(t, "PIX")
			return n
		}, nil, "GPU0-GPU1 is PHB in the node but PIX in any PCI tree"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Export(tc.node(), tc.gpus)
			if err == nil || !strings.Contains(err.Error(), tc.wants) {
				t.Errorf("error %v, want %q", err, tc.wants)
			}
		})
	}
}

func TestAffinityMask(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                     "",
		"c0c0":                 "c0c0",
		"00000000,00ffffff":    "00000000,00ffffff",
		"0-7":                  "000000ff",
		"0-23,48-71":           "000000ff,ffff0000,00ffffff",
		"32":                   "32", // a mask already
		"0,32":                 "0,32",
		"3-1":                  "",
		"N/A":                  "",
		"0-99999999":           "",
		"0-3,8-11,16-19,24-31": "ff0f0f0f",
	} {
		if got := affinityMask(in); got != want {
			t.Errorf("affinityMask(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTolerated: what real files carry besides the tree is read past.
func TestTolerated(t *testing.T) {
	t.Parallel()
	const doc = `<?xml version="1.0"?>
<!-- dumped by NCCL -->
<system version="2">
  <cpu numaid="0" affinity="ff" arch="x86_64" vendor="GenuineIntel">
    <pci busid="0000:01:00.0" class="0x030200" link_speed="8.0 GT/s PCIe">
      <gpu dev="0" sm="90"><c2c bw="40" count="10"/></gpu>
      <pcilink target="0000:02:00.0"/>
    </pci>
    <pci busid="0000:02:00.0" class="0x030000" vendor="0x1a03"/>
    <pci busid="0000:03:00.0" class="0x010802"/>
    <future attr="1"><pci busid="x"/></future>
  </cpu>
</system>
`
	n, err := Parse("tolerated.xml", []byte(doc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.GPUs) != 1 || len(n.NICs) != 0 || n.NICPaths != nil || n.PCIeGen != 3 {
		t.Errorf("node %+v", n)
	}
	for _, w := range []string{"ignored <c2c>", "ignored <pcilink>", "vendor 0x1a03, not an NVIDIA GPU", "ignored element <future> (line 11)"} {
		if !hasWarning(n, w) {
			t.Errorf("no warning %q in %q", w, n.Warnings)
		}
	}
}

// The first <cpu> naming its arch gives the node's CPU, as NCCL reads it;
// a familyid or modelid that is not a number leaves it unknown with a
// warning rather than refusing a file that NCCL would read.
func TestCPU(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, cpu string
		want      topology.CPU
		warn      string
	}{
		{"intel", `<cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="85">`,
			topology.CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6, Model: 85}, ""},
		{"zhaoxin keeps its spaces", `<cpu numaid="0" arch="x86_64" vendor="  Shanghai  " familyid="7" modelid="91">`,
			topology.CPU{Arch: "x86_64", Vendor: "  Shanghai  ", Family: 7, Model: 91}, ""},
		{"no cpu attributes", `<cpu numaid="0">`, topology.CPU{}, ""},
		{"bad modelid", `<cpu numaid="0" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="Skylake">`,
			topology.CPU{Arch: "x86_64", Vendor: "GenuineIntel", Family: 6}, `modelid="Skylake"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			doc := `<system version="1">` + tc.cpu + `<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0"/></pci></cpu></system>`
			n, err := Parse("f.xml", []byte(doc), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if n.CPU != tc.want {
				t.Errorf("CPU %+v, want %+v", n.CPU, tc.want)
			}
			warned := strings.Contains(strings.Join(n.Warnings, "\n"), tc.warn)
			if tc.warn != "" && !warned {
				t.Errorf("warnings %q lack %q", n.Warnings, tc.warn)
			}
		})
	}
}
