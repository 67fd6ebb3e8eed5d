package gpuspeed

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

// Every GPU name the repository's cluster files, node models, topology
// fixtures and nvidia-smi captures carry resolves to its own entry.
func TestLookupNames(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"A100-SXM4-80GB", "A100 SXM 80GB"},
		{"NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"},
		{"NVIDIA A100-SXM4-40GB", "A100 40GB"},
		{"NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"},
		{"a100", "A100 SXM 80GB"},
		{"A800", "A800 SXM 80GB"},
		{"H100-SXM5-80GB", "H100 SXM"},
		{"NVIDIA H100 80GB HBM3", "H100 SXM"},
		{"H100", "H100 SXM"},
		{"NVIDIA H100 PCIe", "H100 PCIe"},
		{"NVIDIA H100 NVL", "H100 NVL"},
		{"H800", "H800 SXM"},
		{"NVIDIA H200", "H200 SXM"},
		{"H200-SXM", "H200 SXM"},
		{"B200", "B200"},
		{"NVIDIA GB200", "GB200"},
		{"B100", "B100"},
		{"L40S", "L40S"},
		{"NVIDIA L40", "L40"},
		{"NVIDIA L4", "L4"},
		{"A10", "A10"},
		{"NVIDIA A30", "A30"},
		{"NVIDIA A40", "A40"},
		{"T4", "T4"},
		{"Tesla T4", "T4"},
		{"Tesla V100-SXM2-32GB", "V100 SXM2"},
		{"Tesla V100-SXM3-32GB", "V100 SXM2"},
		{"Tesla V100-PCIE-16GB", "V100 PCIe"},
		{"Tesla P100-SXM2-16GB", "P100"},
		{"Quadro-RTX-6000", "Quadro RTX 6000"},
		{"Quadro RTX 6000", "Quadro RTX 6000"},
		{"NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"},
		{"NVIDIA RTX A6000", "RTX A6000"},
		{"RTX-4090", "RTX 4090"},
		{"NVIDIA GeForce RTX 4090", "RTX 4090"},
		{"rtx4090", "RTX 4090"},
		{"NVIDIA GeForce RTX 5090", "RTX 5090"},
		{"GeForce RTX 3090", "RTX 3090"},
		{"NVIDIA GeForce RTX 2080 Ti", "RTX 2080 Ti"},
	} {
		s, ok := Lookup(c.name)
		if !ok || s.Name != c.want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", c.name, s.Name, ok, c.want)
		}
	}
	for _, name := range []string{"", "G2", "NVIDIA", "RTX A4000", "GTX 1080", "MI300X", "H20"} {
		if s, ok := Lookup(name); ok {
			t.Errorf("Lookup(%q) = %q; want unknown", name, s.Name)
		}
	}
}

// Every entry has figures and a source, and its own name finds it (no
// entry above it in the table swallows it).
func TestTableEntries(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Models() {
		if seen[s.Name] {
			t.Errorf("%s: listed twice", s.Name)
		}
		seen[s.Name] = true
		if !(s.TFLOPS > 0) || !(s.MemGBps > 0) {
			t.Errorf("%s: TFLOPS %v, MemGBps %v: both must be positive", s.Name, s.TFLOPS, s.MemGBps)
		}
		if len(s.Sources) == 0 {
			t.Errorf("%s: no source", s.Name)
		}
		for _, u := range s.Sources {
			if !strings.HasPrefix(u, "https://") {
				t.Errorf("%s: source %q is not an https URL", s.Name, u)
			}
		}
		if got, ok := Lookup(s.Name); !ok || got.Name != s.Name {
			t.Errorf("Lookup(%q) = %q, %v: an entry above it matches its name", s.Name, got.Name, ok)
		}
	}
}

func TestFactor(t *testing.T) {
	for _, c := range []struct {
		on, ref string
		want    float64
		ok      bool
	}{
		{"A100-SXM4-80GB", "a100", 1, true},
		// sqrt(312·2039) / sqrt(989·3350)
		{"H100-SXM5-80GB", "a100", math.Sqrt(312*2039) / math.Sqrt(989*3350), true},
		// sqrt(312·2039) / sqrt(65·320)
		{"T4", "a100", math.Sqrt(312*2039) / math.Sqrt(65*320), true},
		{"T4", "H100", math.Sqrt(989*3350) / math.Sqrt(65*320), true},
		{"MI300X", "a100", 1, false},
		{"T4", "", 1, false},
	} {
		got, ok := Factor(c.on, c.ref)
		if ok != c.ok || math.Abs(got-c.want) > 1e-12*c.want {
			t.Errorf("Factor(%q, %q) = %v, %v; want %v, %v", c.on, c.ref, got, ok, c.want, c.ok)
		}
	}
	// The doc's figures.
	if f, _ := Factor("H100", "A100"); math.Round(f*100) != 44 {
		t.Errorf("H100 against A100: %.3f; the package doc says 0.44", f)
	}
	if f, _ := Factor("T4", "A100"); math.Round(f*10) != 55 {
		t.Errorf("T4 against A100: %.3f; the package doc says 5.5", f)
	}
}

func TestSlowestFactor(t *testing.T) {
	t4, _ := Factor("T4", "a100")
	for _, c := range []struct {
		models []string
		want   float64
		ok     bool
	}{
		{[]string{"H100", "T4", "A100"}, t4, true},
		{[]string{"A100", "A100"}, 1, true},
		{[]string{"A100", "MI300X"}, 1, false},
		{nil, 1, false},
	} {
		got, ok := SlowestFactor(c.models, "a100")
		if ok != c.ok || math.Abs(got-c.want) > 1e-12 {
			t.Errorf("SlowestFactor(%v) = %v, %v; want %v, %v", c.models, got, ok, c.want, c.ok)
		}
	}
}

func TestJobCompute(t *testing.T) {
	h100, _ := Factor("H100", "a100")
	l40s2h100 := Spec.Speed(mustLookup(t, "L40S")) / Spec.Speed(mustLookup(t, "H100"))
	for _, c := range []struct {
		name    string
		byModel map[string]float64
		base    float64
		on      string
		want    float64
		from    string
		ok      bool
	}{
		{"measured there, same spelling", map[string]float64{"T4": 9}, 1, "T4", 9, "T4", true},
		{"measured there, other spelling", map[string]float64{"H100-SXM5-80GB": 2}, 1, "NVIDIA H100 80GB HBM3", 2, "H100 SXM", true},
		{"no measurement: base on the reference", nil, 4, "H100", 4 * h100, "A100 SXM 80GB", true},
		{"the closest measured model", map[string]float64{"T4": 30, "L40S": 3}, 1, "H100", 3 * l40s2h100, "L40S", true},
		{"unknown measured models are passed over", map[string]float64{"MI300X": 1}, 4, "H100", 4 * h100, "A100 SXM 80GB", true},
		{"unknown target", map[string]float64{"T4": 9}, 4, "MI300X", 4, "", false},
	} {
		got, from, ok := JobComputeFrom(c.byModel, c.base, c.on, "a100")
		if ok != c.ok || from != c.from || math.Abs(got-c.want) > 1e-12*c.want {
			t.Errorf("%s: JobComputeFrom = %v, %q, %v; want %v, %q, %v", c.name, got, from, ok, c.want, c.from, c.ok)
		}
		if got2, ok2 := JobCompute(c.byModel, c.base, c.on, "a100"); got2 != got || ok2 != ok {
			t.Errorf("%s: JobCompute = %v, %v; JobComputeFrom said %v, %v", c.name, got2, ok2, got, ok)
		}
	}
}

func mustLookup(t *testing.T, name string) Spec {
	t.Helper()
	s, ok := Lookup(name)
	if !ok {
		t.Fatalf("Lookup(%q): unknown", name)
	}
	return s
}

// Lookup's cache answers as the table does, and stops growing at
// maxLookups however many names jobs bring.
func TestLookupCache(t *testing.T) {
	for i := range maxLookups + 100 {
		if _, ok := Lookup("MI300X-" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + strconv.Itoa(i)); ok {
			t.Fatalf("name %d found", i)
		}
	}
	if n := lookupsHeld.Load(); n > maxLookups {
		t.Errorf("%d names cached, at most %d", n, maxLookups)
	}
	for range 2 {
		if s, ok := Lookup("NVIDIA H100 80GB HBM3"); !ok || s.Name != "H100 SXM" {
			t.Errorf("Lookup(H100) = %q, %v after the cache filled", s.Name, ok)
		}
	}
}
