package ncclxml

import (
	"reflect"
	"testing"
)

// FuzzParse: Parse never panics; what it accepts validates, exports, and
// reads back as the same node, whose export is the same file.
func FuzzParse(f *testing.F) {
	for _, name := range testdataFiles(f) {
		f.Add(readTestdata(f, name))
	}
	for _, s := range []string{
		"",
		classesDoc,
		directDoc,
		dgxDoc(),
		"<system/>",
		goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu dev="0"><nvlink target="0000:02:00.0" count="2"/></gpu></pci>` +
			`<pci busid="0000:02:00.0" class="0x030200"><gpu dev="1"><nvlink target="0000:01:00.0" count="2"/></gpu></pci></cpu></system>`,
		goodHead + `<pci busid="0000:10:00.0" class="0x060000"><pci busid="0000:11:00.0" class="0x030000"/><pci busid="0000:12:00.0" class="0x020000"/></pci>` +
			`<nic><net name="eth0" gdr="1" speed="1"/></nic></cpu><cpu numaid="0"/></system>`,
		goodHead + `<pci busid="0000:01:00.0" class="0x030200"><gpu><nvlink target="fffffff:ff:ff.0" count="6" tclass="0x068000"/></gpu></pci>` +
			`<pci busid="0000:c4:00.0" class="0x068000"/><unknown a="b"><pci/></unknown></cpu></system>`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Parse("fuzz.xml", data, Options{})
		if err != nil {
			return
		}
		if err := n.Validate(); err != nil {
			t.Fatalf("accepted node does not validate: %v", err)
		}
		out, err := Export(n, nil)
		if err != nil {
			t.Fatalf("Export of an accepted node: %v", err)
		}
		back, err := Parse("exported.xml", out, Options{})
		if err != nil {
			t.Fatalf("exported file does not parse: %v\n%s", err, out)
		}
		if got, want := kept(back), kept(n); !reflect.DeepEqual(got, want) {
			t.Fatalf("export changes the node:\n%s\nwant\n%s\n%s", render(&got), render(&want), out)
		}
		again, err := Export(back, nil)
		if err != nil || string(again) != string(out) {
			t.Fatalf("Export∘Parse not stable (%v):\n%s\nfirst:\n%s", err, again, out)
		}
	})
}
