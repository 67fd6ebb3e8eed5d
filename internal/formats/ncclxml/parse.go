package ncclxml

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/toposched/toposched/internal/topology"
)

// Limits that keep a hostile file from costing more than a real one could.
const (
	maxDepth = 128
	maxGPUs  = 256
	maxNICs  = 1024
)

// kind is what a <cpu> or <pci> element of the tree is.
type kind uint8

const (
	kindCPU        kind = iota
	kindBridge          // a PCIe switch or bridge (0x0604xx), or any pci with pci children
	kindHostBridge      // a PCIe host bridge (0x0600xx)
	kindGPU             // a pci with a <gpu> child, or of class 0x03xxxx
	kindNIC             // a pci with a <nic> child, or of class 0x02xxxx
	kindNVSwitch        // class 0x068000
	kindOther           // a leaf of any other class: ignored
)

// elem is a <cpu> or <pci> element.
type elem struct {
	kind     kind
	line     int
	parent   *elem // nil for a cpu
	cpu      *elem // the enclosing cpu; a cpu's is itself
	depth    int   // 0 for a cpu, 1 for a pci right under it
	children []*elem

	// pci
	busID     busID
	class     string // lower case, as given
	vendor    string // lower case, as given
	device    string
	linkSpeed string
	gpu       *gpuElem
	nic       *nicElem

	// cpu
	numa     int // -1 when not given
	affinity string
	proc     topology.CPU // arch, vendor, familyid, modelid as given
	cpuNICs  []*nicElem   // <nic> elements directly under the cpu
}

type gpuElem struct {
	line    int
	dev     int
	hasDev  bool
	sm      int // 0 when not given
	nvlinks []nvlinkElem
}

type nvlinkElem struct {
	line   int
	target busID
	tclass string // lower case, "" when not given
	count  int
}

type nicElem struct {
	line int
	nets []netElem
}

type netElem struct {
	line      int
	name      string
	dev       int
	hasDev    bool
	speedMbps int64
	gdr       bool
}

// tree is a parsed file: the cpus in document order with their pci trees.
type tree struct {
	file     string
	cpus     []*elem
	pcis     []*elem // every pci element, in document order
	warnings []string
}

func (t *tree) warnf(format string, args ...any) {
	t.warnings = append(t.warnings, fmt.Sprintf(format, args...))
}

// frame is one open element while the document is read.
type frame struct {
	name   string
	line   int
	desc   string // how errors name it: <pci busid="0000:07:00.0">
	el     *elem
	gpu    *gpuElem
	nic    *nicElem
	ignore bool // an unknown element: its content is skipped
}

type parser struct {
	t        *tree
	dec      *xml.Decoder
	stack    []frame
	rootSeen bool
	rootDone bool
	hostHash string
	hashLine int
	busIDs   map[busID]int // pci bus id -> line
	ignored  map[string]bool
}

func (p *parser) errf(line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", p.t.file, line, fmt.Sprintf(format, args...))
}

// unclosed lists the open elements, innermost first.
func (p *parser) unclosed() string {
	var parts []string
	for i := len(p.stack) - 1; i >= 0; i-- {
		parts = append(parts, fmt.Sprintf("%s at line %d", p.stack[i].desc, p.stack[i].line))
	}
	return strings.Join(parts, ", ")
}

// parseTree reads the document into a tree. Errors name the file, the line
// and what was expected; a cut document's error lists the elements left
// open.
func parseTree(file string, data []byte) (*tree, error) {
	p := &parser{
		t:       &tree{file: file},
		dec:     xml.NewDecoder(bytes.NewReader(data)),
		busIDs:  map[busID]int{},
		ignored: map[string]bool{},
	}
	for {
		line, _ := p.dec.InputPos()
		tok, err := p.dec.Token()
		if errors.Is(err, io.EOF) {
			switch {
			case !p.rootSeen:
				return nil, p.errf(line, "empty document: expected <system version=\"1\">")
			case len(p.stack) > 0:
				return nil, p.errf(line, "document ends before </%s>: unclosed %s", p.stack[0].name, p.unclosed())
			}
			return p.t, nil
		}
		if err != nil {
			var se *xml.SyntaxError
			if errors.As(err, &se) {
				if len(p.stack) == 0 {
					return nil, p.errf(se.Line, "not well-formed XML: %s", se.Msg)
				}
				if se.Msg == "unexpected EOF" {
					return nil, p.errf(se.Line, "document ends before </%s>: unclosed %s", p.stack[0].name, p.unclosed())
				}
				return nil, p.errf(se.Line, "not well-formed XML (%s): the document is cut or broken here; unclosed %s",
					se.Msg, p.unclosed())
			}
			return nil, fmt.Errorf("%s:%d: %w", file, line, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if err := p.start(tok, line); err != nil {
				return nil, err
			}
		case xml.EndElement:
			// The decoder checks that the names match.
			p.stack = p.stack[:len(p.stack)-1]
			if len(p.stack) == 0 {
				p.rootDone = true
			}
		case xml.CharData:
			text := strings.TrimSpace(string(tok))
			if text == "" {
				continue
			}
			// The line of the text, not of the whitespace before it.
			lead := len(tok) - len(bytes.TrimLeftFunc(tok, unicode.IsSpace))
			line += bytes.Count(tok[:lead], []byte("\n"))
			if len(text) > 40 {
				text = text[:40] + "..."
			}
			switch {
			case !p.rootSeen:
				return nil, p.errf(line, "text %q before the root element: expected <system version=\"1\"> (is this a fragment of a topology file?)", text)
			case p.rootDone:
				return nil, p.errf(line, "text %q after </system>: expected the end of the document", text)
			case p.stack[len(p.stack)-1].ignore:
				continue
			}
			top := p.stack[len(p.stack)-1]
			return nil, p.errf(line, "unexpected text %q in %s (line %d): expected elements only (is the document cut or annotated?)", text, top.desc, top.line)
		}
	}
}

var knownElements = map[string]string{
	"system": "no element (it is the root)", "cpu": "<system>", "pci": "<cpu> or <pci>", "nic": "<cpu> or <pci>", "gpu": "<pci>",
	"net": "<nic>", "nvlink": "<gpu>", "c2c": "<gpu>", "pcilink": "<pci>",
}

// expected says what may appear inside an element.
var expected = map[string]string{
	"system": "<cpu>", "cpu": "<pci> or <nic>", "pci": "<pci>, <gpu> or <nic>", "gpu": "<nvlink>",
	"nic": "<net>", "net": "no element", "nvlink": "no element",
}

func (p *parser) start(se xml.StartElement, line int) error {
	name := se.Name.Local
	attrs := map[string]string{}
	for _, a := range se.Attr {
		if _, dup := attrs[a.Name.Local]; !dup {
			attrs[a.Name.Local] = a.Value
		}
	}
	if len(p.stack) >= maxDepth {
		return p.errf(line, "<%s> nested %d elements deep: expected at most %d", name, len(p.stack)+1, maxDepth)
	}
	if len(p.stack) == 0 {
		if p.rootDone {
			return p.errf(line, "<%s> after </system>: expected the end of the document", name)
		}
		if name != "system" {
			return p.errf(line, "root element <%s>: expected <system version=\"1\"> (an NCCL topology file)", name)
		}
		p.rootSeen = true
		p.push(frame{name: name, line: line, desc: "<system>"})
		return nil
	}
	parent := &p.stack[len(p.stack)-1]
	if parent.ignore {
		p.push(frame{name: name, line: line, desc: "<" + name + ">", ignore: true})
		return nil
	}
	where, known := knownElements[name]
	if !known {
		if !p.ignored[name] {
			p.ignored[name] = true
			p.t.warnf("ignored element <%s> (line %d): not part of NCCL's topology format as this importer knows it", name, line)
		}
		p.push(frame{name: name, line: line, desc: "<" + name + ">", ignore: true})
		return nil
	}
	misplaced := func() error {
		return p.errf(line, "unexpected <%s> in %s (line %d): expected %s there; <%s> belongs in %s",
			name, parent.desc, parent.line, expected[parent.name], name, where)
	}
	switch name {
	case "system":
		return misplaced()
	case "cpu":
		if parent.name != "system" {
			return misplaced()
		}
		return p.startCPU(attrs, line)
	case "pci":
		if parent.name != "cpu" && parent.name != "pci" {
			return misplaced()
		}
		return p.startPCI(attrs, line, parent.el)
	case "gpu":
		if parent.name != "pci" {
			return misplaced()
		}
		return p.startGPU(attrs, line, parent)
	case "nvlink":
		if parent.name != "gpu" {
			return misplaced()
		}
		return p.startNVLink(attrs, line, parent)
	case "nic":
		if parent.name != "pci" && parent.name != "cpu" {
			return misplaced()
		}
		return p.startNIC(line, parent)
	case "net":
		if parent.name != "nic" {
			return misplaced()
		}
		return p.startNet(attrs, line, parent)
	case "c2c", "pcilink":
		if (name == "c2c") != (parent.name == "gpu") || (name == "pcilink") != (parent.name == "pci") {
			return misplaced()
		}
		if !p.ignored[name] {
			p.ignored[name] = true
			p.t.warnf("ignored <%s> (line %d): it does not change GPU or NIC paths here", name, line)
		}
		p.push(frame{name: name, line: line, desc: "<" + name + ">", ignore: true})
		return nil
	}
	return misplaced()
}

func (p *parser) push(f frame) { p.stack = append(p.stack, f) }

// intAttr reads an optional integer attribute within [lo, hi]; "" counts as
// absent.
func (p *parser) intAttr(attrs map[string]string, elemName, attr string, line int, lo, hi int64) (int64, bool, error) {
	s, ok := attrs[attr]
	s = strings.TrimSpace(s)
	if !ok || s == "" {
		return 0, false, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < lo || v > hi {
		return 0, false, p.errf(line, "<%s %s=%q>: expected an integer from %d to %d", elemName, attr, s, lo, hi)
	}
	return v, true, nil
}

func (p *parser) startCPU(attrs map[string]string, line int) error {
	c := &elem{kind: kindCPU, line: line, numa: -1}
	c.cpu = c
	numa, ok, err := p.intAttr(attrs, "cpu", "numaid", line, -1, 1<<20)
	if err != nil {
		return err
	}
	if ok {
		c.numa = int(numa)
	}
	// The vendor as given: Zhaoxin's "  Shanghai  " keeps its spaces.
	c.proc = topology.CPU{Arch: strings.TrimSpace(attrs["arch"]), Vendor: attrs["vendor"]}
	for _, f := range []struct {
		attr string
		dst  *int
	}{{"familyid", &c.proc.Family}, {"modelid", &c.proc.Model}} {
		// Only the cost model's CPU kind needs these: a bad one is
		// warned of, not a reason to refuse the file.
		v, ok, err := p.intAttr(attrs, "cpu", f.attr, line, 0, 1<<20)
		if err != nil {
			p.t.warnf("%v; the CPU's %s is left unknown", err, f.attr)
		}
		if ok && err == nil {
			*f.dst = int(v)
		}
	}
	c.affinity = strings.TrimSpace(attrs["affinity"])
	if c.affinity != "" && !maskPattern.MatchString(c.affinity) {
		return p.errf(line, "<cpu affinity=%q>: expected a CPU mask in hex words like \"00000000,00ffffff\"", c.affinity)
	}
	if h, ok := attrs["host_hash"]; ok {
		if p.hashLine == 0 {
			p.hostHash, p.hashLine = h, line
		} else if h != p.hostHash {
			return p.errf(line, "<cpu host_hash=%q> differs from host_hash=%q at line %d: expected the cpus of one host (a multi-node file is not one node)",
				h, p.hostHash, p.hashLine)
		}
	}
	p.t.cpus = append(p.t.cpus, c)
	desc := "<cpu>"
	if c.numa >= 0 {
		desc = fmt.Sprintf("<cpu numaid=%d>", c.numa)
	}
	p.push(frame{name: "cpu", line: line, desc: desc, el: c})
	return nil
}

var classPattern = regexp.MustCompile(`^0x[0-9a-f]+$`)

func (p *parser) startPCI(attrs map[string]string, line int, parent *elem) error {
	raw, ok := attrs["busid"]
	if !ok || strings.TrimSpace(raw) == "" {
		return p.errf(line, "<pci> without busid: expected busid=\"dddd:bb:dd.f\"")
	}
	id, ok := parseBusID(raw)
	if !ok || id.placeholder {
		return p.errf(line, "<pci busid=%q>: expected a PCI bus id like \"0000:07:00.0\" (device 00 to 1f)", raw)
	}
	desc := fmt.Sprintf("<pci busid=%q>", id)
	if prev, dup := p.busIDs[id]; dup {
		return p.errf(line, "%s: the same bus id is already at line %d", desc, prev)
	}
	p.busIDs[id] = line
	class := strings.ToLower(strings.TrimSpace(attrs["class"]))
	if !classPattern.MatchString(class) {
		if class == "" {
			return p.errf(line, "%s without class: expected a PCI class like class=\"0x030200\"", desc)
		}
		return p.errf(line, "%s class=%q: expected a PCI class like \"0x030200\"", desc, attrs["class"])
	}
	e := &elem{
		kind: kindOther, line: line, parent: parent, cpu: parent.cpu, depth: parent.depth + 1, busID: id, class: class,
		vendor:    strings.ToLower(strings.TrimSpace(attrs["vendor"])),
		device:    strings.ToLower(strings.TrimSpace(attrs["device"])),
		linkSpeed: strings.TrimSpace(attrs["link_speed"]),
	}
	if parent.gpu != nil {
		return p.errf(line, "%s inside the GPU at line %d: expected a GPU to hold no other PCI device", desc, parent.line)
	}
	if parent.nic != nil {
		return p.errf(line, "%s inside the NIC at line %d: expected a NIC to hold no other PCI device", desc, parent.line)
	}
	parent.children = append(parent.children, e)
	p.t.pcis = append(p.t.pcis, e)
	p.push(frame{name: "pci", line: line, desc: desc, el: e})
	return nil
}

func (p *parser) startGPU(attrs map[string]string, line int, parent *frame) error {
	pci := parent.el
	if pci.gpu != nil {
		return p.errf(line, "second <gpu> in %s: the first is at line %d", parent.desc, pci.gpu.line)
	}
	if pci.nic != nil {
		return p.errf(line, "<gpu> in %s, which holds a <nic> (line %d): expected one device per PCI function", parent.desc, pci.nic.line)
	}
	if len(pci.children) > 0 {
		return p.errf(line, "<gpu> in %s, which holds other PCI devices (line %d): expected a GPU to be a leaf", parent.desc, pci.children[0].line)
	}
	g := &gpuElem{line: line}
	dev, ok, err := p.intAttr(attrs, "gpu", "dev", line, 0, 1<<20)
	if err != nil {
		return err
	}
	g.dev, g.hasDev = int(dev), ok
	sm, _, err := p.intAttr(attrs, "gpu", "sm", line, 0, 1<<20)
	if err != nil {
		return err
	}
	g.sm = int(sm)
	pci.gpu = g
	p.push(frame{name: "gpu", line: line, desc: "<gpu>", el: pci, gpu: g})
	return nil
}

func (p *parser) startNVLink(attrs map[string]string, line int, parent *frame) error {
	raw, ok := attrs["target"]
	if !ok || strings.TrimSpace(raw) == "" {
		return p.errf(line, "<nvlink> without target: expected target=\"<bus id of the GPU or NVSwitch at the other end>\"")
	}
	target, ok := parseBusID(raw)
	if !ok {
		return p.errf(line, "<nvlink target=%q>: expected a PCI bus id like \"0000:07:00.0\"", raw)
	}
	count, ok, err := p.intAttr(attrs, "nvlink", "count", line, 1, 64)
	if err != nil {
		return err
	}
	if !ok {
		return p.errf(line, "<nvlink target=%q> without count: expected count=\"N\", the number of links", raw)
	}
	tclass := strings.ToLower(strings.TrimSpace(attrs["tclass"]))
	if tclass != "" && !classPattern.MatchString(tclass) {
		return p.errf(line, "<nvlink tclass=%q>: expected a PCI class like \"0x068000\"", attrs["tclass"])
	}
	parent.gpu.nvlinks = append(parent.gpu.nvlinks, nvlinkElem{line: line, target: target, tclass: tclass, count: int(count)})
	p.push(frame{name: "nvlink", line: line, desc: "<nvlink>"})
	return nil
}

func (p *parser) startNIC(line int, parent *frame) error {
	n := &nicElem{line: line}
	if parent.name == "cpu" {
		parent.el.cpuNICs = append(parent.el.cpuNICs, n)
	} else {
		pci := parent.el
		switch {
		case pci.nic != nil:
			return p.errf(line, "second <nic> in %s: the first is at line %d", parent.desc, pci.nic.line)
		case pci.gpu != nil:
			return p.errf(line, "<nic> in %s, which holds a <gpu> (line %d): expected one device per PCI function", parent.desc, pci.gpu.line)
		case len(pci.children) > 0:
			return p.errf(line, "<nic> in %s, which holds other PCI devices (line %d): expected a NIC to be a leaf", parent.desc, pci.children[0].line)
		}
		pci.nic = n
	}
	p.push(frame{name: "nic", line: line, desc: "<nic>", el: parent.el, nic: n})
	return nil
}

func (p *parser) startNet(attrs map[string]string, line int, parent *frame) error {
	name := strings.TrimSpace(attrs["name"])
	if name == "" {
		return p.errf(line, "<net> without name: expected name=\"mlx5_0\" (the network device)")
	}
	n := netElem{line: line, name: name}
	dev, ok, err := p.intAttr(attrs, "net", "dev", line, 0, 1<<20)
	if err != nil {
		return err
	}
	n.dev, n.hasDev = int(dev), ok
	// Up to 1 Pb/s: no real link is near it.
	speed, _, err := p.intAttr(attrs, "net", "speed", line, 0, 1_000_000_000)
	if err != nil {
		return err
	}
	n.speedMbps = speed
	gdr, _, err := p.intAttr(attrs, "net", "gdr", line, 0, 1)
	if err != nil {
		return err
	}
	n.gdr = gdr == 1
	parent.nic.nets = append(parent.nic.nets, n)
	p.push(frame{name: "net", line: line, desc: fmt.Sprintf("<net name=%q>", name)})
	return nil
}
