package fabric

import (
	"bytes"
	"encoding/csv"
	"errors"
	"io"
	"strings"

	"github.com/toposched/toposched/events"
)

// maxClosName bounds a switch cell of a Clos table.
const maxClosName = 253

// closColumns are the columns ParseClosCSV needs, in the order errors list
// them.
var closColumns = []string{"ip", "DSW", "PSW", "ASW"}

// orderedSet keeps names in order of first appearance.
type orderedSet struct {
	names []string
	has   map[string]bool
}

func (s *orderedSet) add(name string) {
	if s.has == nil {
		s.has = map[string]bool{}
	}
	if !s.has[name] {
		s.has[name] = true
		s.names = append(s.names, name)
	}
}

// ParseClosCSV reads a three-tier Clos table: a header with the columns ip,
// DSW, PSW and ASW (any case, any order, other columns ignored), then one
// row per host. ASW is the host's leaf (ToR), PSW the spine above that leaf
// and DSW the core above that spine. Leaves are named "<PSW>/<ASW>" because
// ASW labels are local to their PSW (see the package documentation). file
// names the file in errors.
func ParseClosCSV(file string, data []byte) (events.TopologyFabric, error) {
	p := &problems{file: file}
	r := csv.NewReader(bytes.NewReader(bytes.TrimPrefix(data, []byte("\ufeff"))))
	r.FieldsPerRecord = -1
	header, err := r.Read()
	if errors.Is(err, io.EOF) {
		p.add(1, "header: expected the columns ip, DSW, PSW and ASW, got an empty file")
		return events.TopologyFabric{}, p.err()
	}
	if err != nil {
		addCSVError(p, err)
		return events.TopologyFabric{}, p.err()
	}
	headerLine, _ := r.FieldPos(0)
	col := map[string]int{}
	for i, h := range header {
		key := strings.ToLower(strings.TrimSpace(h))
		for _, want := range closColumns {
			if key != strings.ToLower(want) {
				continue
			}
			if prev, ok := col[want]; ok {
				p.add(headerLine, "header: expected each of ip, DSW, PSW and ASW once, got %q in columns %d and %d", h, prev+1, i+1)
			}
			col[want] = i
		}
	}
	var missing []string
	for _, want := range closColumns {
		if _, ok := col[want]; !ok {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		p.add(headerLine, "header: expected the columns ip, DSW, PSW and ASW, got %q without %s", strings.Join(header, ","), strings.Join(missing, ", "))
	}
	if !p.empty() {
		return events.TopologyFabric{}, p.err()
	}

	var (
		cores, spines, leaves orderedSet
		coreSpines            = map[string]*orderedSet{}
		spineLeaves           = map[string]*orderedSet{}
		leafNodes             = map[string][]string{}
		hostLine              = map[string]int{}
		tierOf                = map[string]string{} // core or spine name -> tier
		tierLine              = map[string]int{}
		rows                  int
	)
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			addCSVError(p, err)
			break
		}
		line, _ := r.FieldPos(0)
		if len(rec) != len(header) {
			p.add(line, "row: expected %d columns as in the header, got %d", len(header), len(rec))
			continue
		}
		rows++
		cell := map[string]string{}
		ok := true
		for _, c := range closColumns {
			v := strings.TrimSpace(rec[col[c]])
			name := strings.TrimSpace(header[col[c]])
			switch {
			case v == "":
				p.add(line, "%s: expected a name, got an empty cell", name)
				ok = false
			case c == "ip" && !nodeNamePattern.MatchString(v):
				p.add(line, "%s: expected a host name or address (letters, digits, '.', '_', '-'), got %q", name, abbreviate(v))
				ok = false
			case c != "ip" && (len(v) > maxClosName || !switchNamePattern.MatchString(v)):
				p.add(line, "%s: expected a switch name of at most %d letters, digits, '.', '_', ':' or '-', got %q", name, maxClosName, abbreviate(v))
				ok = false
			}
			cell[c] = v
		}
		if !ok {
			continue
		}
		host, core, spine := cell["ip"], cell["DSW"], cell["PSW"]
		if prev, dup := hostLine[host]; dup {
			p.add(line, "%s: expected each host once, got %q again (first on line %d)", strings.TrimSpace(header[col["ip"]]), host, prev)
			continue
		}
		hostLine[host] = line
		for _, sw := range []struct{ name, tier, col string }{{core, TierCore, "DSW"}, {spine, TierSpine, "PSW"}} {
			if t, seen := tierOf[sw.name]; seen && t != sw.tier {
				p.add(line, "%s: expected a name not used in another column, got %q, a %s switch on line %d", strings.TrimSpace(header[col[sw.col]]), sw.name, t, tierLine[sw.name])
				ok = false
			} else if !seen {
				tierOf[sw.name], tierLine[sw.name] = sw.tier, line
			}
		}
		if !ok {
			continue
		}
		leaf := spine + "/" + cell["ASW"]
		cores.add(core)
		spines.add(spine)
		leaves.add(leaf)
		if coreSpines[core] == nil {
			coreSpines[core] = &orderedSet{}
		}
		coreSpines[core].add(spine)
		if spineLeaves[spine] == nil {
			spineLeaves[spine] = &orderedSet{}
		}
		spineLeaves[spine].add(leaf)
		leafNodes[leaf] = append(leafNodes[leaf], host)
	}
	if rows == 0 && p.empty() {
		p.add(headerLine+1, "row: expected at least one host row, got none")
	}
	if err := p.err(); err != nil {
		return events.TopologyFabric{}, err
	}
	fab := events.TopologyFabric{Switches: make([]events.Switch, 0, len(cores.names)+len(spines.names)+len(leaves.names))}
	for _, c := range cores.names {
		fab.Switches = append(fab.Switches, events.Switch{Name: c, Tier: TierCore, Switches: coreSpines[c].names})
	}
	for _, s := range spines.names {
		fab.Switches = append(fab.Switches, events.Switch{Name: s, Tier: TierSpine, Switches: spineLeaves[s].names})
	}
	for _, l := range leaves.names {
		fab.Switches = append(fab.Switches, events.Switch{Name: l, Tier: TierLeaf, Nodes: leafNodes[l]})
	}
	return fab, nil
}

// addCSVError reports a CSV syntax error at its line.
func addCSVError(p *problems, err error) {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		p.add(pe.Line, "row: expected well-formed CSV, got %v (column %d)", pe.Err, pe.Column)
		return
	}
	p.add(1, "row: expected readable CSV, got %v", err)
}
