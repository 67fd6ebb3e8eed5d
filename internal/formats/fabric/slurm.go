package fabric

import (
	"errors"
	"fmt"
	"math/bits"
	"regexp"
	"strconv"
	"strings"

	"github.com/toposched/toposched/events"
)

// maxSlurmSwitchName is Slurm's limit on SwitchName (HOST_NAME_MAX).
const maxSlurmSwitchName = 64

// maxDuplicateReports bounds the "below two leaves" errors and warnings of
// one line.
const maxDuplicateReports = 5

// slurmSwitch is one SwitchName or BlockName line.
type slurmSwitch struct {
	name     string
	line     int
	block    bool
	nodes    []string
	children []string
	// hasSwitches: the line gave Switches= (so it is not a leaf).
	hasSwitches bool
}

// ParseSlurm reads a Slurm topology.conf (topology/tree or topology/block;
// see the package documentation for what is accepted and how tiers are
// derived). file names the file in errors.
func ParseSlurm(file string, data []byte) (events.TopologyFabric, error) {
	p := &problems{file: file}
	var (
		switches       []*slurmSwitch
		byName         = map[string]*slurmSwitch{}
		treeLine       int    // first SwitchName line
		blockLine      int    // first BlockName or BlockSizes line
		treeKey        string // its key, as written
		blockKey       string
		blockSizes     []uint64
		blockSizesLine int
		budget         = MaxHostlistNames
		overBudget     bool
	)
	// expand reads a hostlist value, counting it against the file's budget.
	expand := func(line int, key, val string) ([]string, bool) {
		names, err := expandHostlist(val, budget)
		if err != nil {
			if tm := (*tooManyError)(nil); errors.As(err, &tm) {
				if !overBudget {
					p.add(line, "%s: expected at most %d names in the whole file, got more by this line", key, MaxHostlistNames)
				}
				overBudget = true
			} else {
				p.add(line, "%s: expected a hostlist such as node[1-4,7], got %q: %v", key, abbreviate(val), err)
			}
			return nil, false
		}
		budget -= len(names)
		return names, true
	}
	for _, ll := range slurmLines(data) {
		pairs, err := splitPairs(ll.text, "SwitchName=s0 Nodes=node[1-4]")
		if err != nil {
			p.add(ll.line, "%v", err)
			continue
		}
		if len(pairs) == 0 {
			continue
		}
		first := pairs[0]
		switch strings.ToLower(first.key) {
		case "switchname", "blockname":
		case "blocksizes":
			if blockLine == 0 {
				blockLine, blockKey = ll.line, first.key
			}
			if blockSizesLine != 0 {
				p.add(ll.line, "%s: expected it once, got it again (first on line %d)", first.key, blockSizesLine)
				continue
			}
			blockSizesLine = ll.line
			for _, kv := range pairs[1:] {
				p.add(ll.line, "%s: expected BlockSizes alone on its line, got %s=", kv.key, kv.key)
			}
			blockSizes = parseBlockSizes(p, ll.line, first.key, first.val)
			continue
		case "ringname":
			p.add(ll.line, "%s: expected a topology/tree or topology/block line, got ring %q: topology/ring is not supported", first.key, abbreviate(first.val))
			continue
		default:
			p.add(ll.line, "%s: expected SwitchName, BlockName or BlockSizes at the start of a line, got %q", first.key, abbreviate(first.key))
			continue
		}
		sw := &slurmSwitch{name: first.val, line: ll.line, block: strings.EqualFold(first.key, "blockname")}
		if sw.block {
			if blockLine == 0 {
				blockLine, blockKey = ll.line, first.key
			}
		} else if treeLine == 0 {
			treeLine, treeKey = ll.line, first.key
		}
		switch {
		case sw.name == "":
			p.add(ll.line, "%s: expected a name, got nothing", first.key)
		case len(sw.name) > maxSlurmSwitchName || !switchNamePattern.MatchString(sw.name):
			p.add(ll.line, "%s: expected a name of at most %d letters, digits, '.', '_', ':' or '-', got %q", first.key, maxSlurmSwitchName, abbreviate(sw.name))
		case byName[sw.name] != nil:
			p.add(ll.line, "%s: expected a new name, got %q, already defined on line %d", first.key, sw.name, byName[sw.name].line)
		default:
			byName[sw.name] = sw
		}
		seen := map[string]string{} // lower-case key -> key as written
		hasNodes := false
		for _, kv := range pairs[1:] {
			key := strings.ToLower(kv.key)
			if prev, ok := seen[key]; ok {
				p.add(ll.line, "%s: expected it once on the line, got it again (as %s)", prev, kv.key)
				continue
			}
			seen[key] = kv.key
			switch {
			case key == "nodes":
				hasNodes = true
				names, ok := expand(ll.line, kv.key, kv.val)
				if !ok {
					continue
				}
				sw.nodes = uniqueNames(p, ll.line, kv.key, names, nodeNamePattern, 253,
					"host names (letters, digits, '.', '_', '-')")
			case key == "switches" && !sw.block:
				sw.hasSwitches = true
				names, ok := expand(ll.line, kv.key, kv.val)
				if !ok {
					continue
				}
				sw.children = uniqueNames(p, ll.line, kv.key, names, switchNamePattern, maxSlurmSwitchName,
					"switch names (letters, digits, '.', '_', ':', '-')")
			case key == "linkspeed" && !sw.block:
				if _, err := strconv.ParseUint(kv.val, 10, 32); err != nil {
					p.add(ll.line, "%s: expected a whole number, got %q", kv.key, abbreviate(kv.val))
				}
			case sw.block:
				p.add(ll.line, "%s: expected Nodes after BlockName, got unknown key %q", kv.key, kv.key)
			default:
				p.add(ll.line, "%s: expected Nodes, Switches or LinkSpeed after SwitchName, got unknown key %q", kv.key, kv.key)
			}
		}
		if hasNodes && sw.hasSwitches {
			p.add(ll.line, "%s: expected either Nodes or Switches, got both", seen["switches"])
		}
		if sw.block && !hasNodes {
			p.add(ll.line, "%s: expected Nodes= with the block's nodes, got none", first.key)
		}
		switches = append(switches, sw)
	}

	if treeLine != 0 && blockLine != 0 {
		if blockLine > treeLine {
			p.add(blockLine, "%s: expected only SwitchName lines, as line %d starts a topology/tree layout, got a topology/block line", blockKey, treeLine)
		} else {
			p.add(treeLine, "%s: expected only BlockName and BlockSizes lines, as line %d starts a topology/block layout, got a topology/tree line", treeKey, blockLine)
		}
	}
	if len(switches) == 0 && p.empty() {
		p.add(1, "SwitchName: expected at least one SwitchName or BlockName line, got none")
	}
	checkBlockSizes(p, switches, blockSizes, blockSizesLine)
	tiers := slurmTiers(p, switches, byName)
	warnings := checkLeafNodes(p, switches)
	if err := p.err(); err != nil {
		return events.TopologyFabric{}, err
	}
	fab := events.TopologyFabric{Switches: make([]events.Switch, 0, len(switches)), Warnings: warnings}
	for _, sw := range switches {
		fab.Switches = append(fab.Switches, events.Switch{
			Name:     sw.name,
			Tier:     tiers[sw.name],
			Nodes:    sw.nodes,
			Switches: sw.children,
		})
	}
	return fab, nil
}

// uniqueNames checks each name and drops repeats, keeping the first.
func uniqueNames(p *problems, line int, key string, names []string, pattern *regexp.Regexp, maxLen int, what string) []string {
	seen := make(map[string]bool, len(names))
	out := names[:0]
	for _, n := range names {
		if len(n) > maxLen || !pattern.MatchString(n) {
			p.add(line, "%s: expected %s of at most %d characters, got %q", key, what, maxLen, abbreviate(n))
			return nil
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}

// parseBlockSizes reads BlockSizes as Slurm does: positive sizes, each a
// power-of-two multiple (at most 2^15) of the first.
func parseBlockSizes(p *problems, line int, key, val string) []uint64 {
	var sizes []uint64
	for s := range strings.SplitSeq(val, ",") {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil || n == 0 {
			p.add(line, "%s: expected positive node counts such as 30,120, got %q", key, abbreviate(s))
			return nil
		}
		if len(sizes) > 0 {
			base := sizes[0]
			if n%base != 0 || bits.OnesCount64(n/base) != 1 || n/base > 1<<15 {
				p.add(line, "%s: expected %d times a power of two (at most 2^15), got %d", key, base, n)
				return nil
			}
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// checkBlockSizes checks that every block has at least the base block size
// of nodes: the first BlockSizes value or, without it, the first block's
// node count (Slurm's rule).
func checkBlockSizes(p *problems, switches []*slurmSwitch, sizes []uint64, sizesLine int) {
	if sizesLine != 0 && sizes == nil {
		return // BlockSizes itself is wrong, reported already
	}
	var base uint64
	var baseFrom string
	for _, sw := range switches {
		if !sw.block || sw.nodes == nil {
			continue
		}
		switch {
		case len(sizes) > 0:
			base, baseFrom = sizes[0], fmt.Sprintf("the base block size (BlockSizes on line %d)", sizesLine)
		case base == 0:
			base, baseFrom = uint64(len(sw.nodes)), fmt.Sprintf("the first block %s (line %d)", sw.name, sw.line)
			continue
		}
		if uint64(len(sw.nodes)) < base {
			p.add(sw.line, "Nodes: expected at least %d nodes, %s, got %d", base, baseFrom, len(sw.nodes))
		}
	}
}

// slurmTiers derives each switch's tier from its height and reports unknown
// children and cycles.
func slurmTiers(p *problems, switches []*slurmSwitch, byName map[string]*slurmSwitch) map[string]string {
	const (
		unseen = iota
		active
		done
	)
	state := make(map[*slurmSwitch]int, len(switches))
	height := make(map[*slurmSwitch]int, len(switches))
	var stack []*slurmSwitch
	var visit func(sw *slurmSwitch) int
	visit = func(sw *slurmSwitch) int {
		switch state[sw] {
		case done:
			return height[sw]
		case active:
			// A cycle: report it from sw round to sw.
			var path []string
			for i := len(stack) - 1; i >= 0; i-- {
				if stack[i] == sw {
					for _, s := range stack[i:] {
						path = append(path, s.name)
					}
					break
				}
			}
			last := stack[len(stack)-1]
			p.add(last.line, "Switches: expected a tree, got a cycle %s -> %s", strings.Join(path, " -> "), sw.name)
			return 0
		}
		state[sw] = active
		stack = append(stack, sw)
		h := 0
		if sw.hasSwitches {
			h = 1
		}
		for _, c := range sw.children {
			child := byName[c]
			if child == nil {
				p.add(sw.line, "Switches: expected switches defined in this file, got %q", c)
				continue
			}
			h = max(h, visit(child)+1)
		}
		stack = stack[:len(stack)-1]
		state[sw] = done
		height[sw] = h
		return h
	}
	tiers := make(map[string]string, len(switches))
	for _, sw := range switches {
		if byName[sw.name] != sw {
			continue // a repeated or bad name, reported already
		}
		switch visit(sw) {
		case 0:
			tiers[sw.name] = TierLeaf
		case 1:
			tiers[sw.name] = TierSpine
		default:
			tiers[sw.name] = TierCore
		}
	}
	return tiers
}

// checkLeafNodes finds nodes below two leaves. Under two switches of a
// topology/tree layout, Slurm only warns, and so does this: the node stays
// below the first and is dropped from the other, with a warning naming the
// node, both switches and their lines. Under two blocks it is an error.
func checkLeafNodes(p *problems, switches []*slurmSwitch) []string {
	var warnings []string
	owner := map[string]*slurmSwitch{}
	for _, sw := range switches {
		reported := 0
		var kept []string // the nodes left, once one is dropped
		for i, n := range sw.nodes {
			prev := owner[n]
			if prev == nil {
				owner[n] = sw
				if kept != nil {
					kept = append(kept, n)
				}
				continue
			}
			if kept == nil {
				kept = append(make([]string, 0, len(sw.nodes)-1), sw.nodes[:i]...)
			}
			if reported < maxDuplicateReports {
				if sw.block || prev.block {
					p.add(sw.line, "Nodes: expected each node below one leaf, got %q below both %s (line %d) and %s (line %d)", n, prev.name, prev.line, sw.name, sw.line)
				} else {
					warnings = append(warnings, fmt.Sprintf("%s:%d: Nodes: node %q is below both %s (line %d) and %s (line %d): kept below %s, the first (Slurm only warns)",
						p.file, sw.line, n, prev.name, prev.line, sw.name, sw.line, prev.name))
				}
			}
			reported++
		}
		if reported > maxDuplicateReports {
			if sw.block {
				p.add(sw.line, "Nodes: and %d more nodes of %s already below another leaf", reported-maxDuplicateReports, sw.name)
			} else {
				warnings = append(warnings, fmt.Sprintf("%s:%d: Nodes: and %d more nodes of %s already below another leaf: kept below the first",
					p.file, sw.line, reported-maxDuplicateReports, sw.name))
			}
		}
		if kept != nil {
			sw.nodes = kept
		}
	}
	return warnings
}

// SlurmPair is one Key=Value of a Slurm configuration line, the key as
// written (Slurm's keys are case insensitive).
type SlurmPair struct {
	Key, Value string
}

// SlurmLine is one logical line of a Slurm configuration file.
type SlurmLine struct {
	// Line is the line's first physical line, counted from 1.
	Line  int
	Pairs []SlurmPair
	// Err says why the line is not Key=Value pairs (Pairs is then nil);
	// it names no file or line.
	Err error
}

// SlurmLines splits a Slurm configuration file (topology.conf, gres.conf,
// slurm.conf) into its logical lines of Key=Value pairs as Slurm's parser
// reads them: comments, continuations, escapes and quoted values as the
// package documentation describes for topology.conf. Lines with no pairs
// are left out. example is a well-formed line of the file's kind, which a
// syntax error quotes.
func SlurmLines(data []byte, example string) []SlurmLine {
	var out []SlurmLine
	for _, ll := range slurmLines(data) {
		pairs, err := splitPairs(ll.text, example)
		if err != nil {
			out = append(out, SlurmLine{Line: ll.line, Err: err})
			continue
		}
		if len(pairs) == 0 {
			continue
		}
		sl := SlurmLine{Line: ll.line, Pairs: make([]SlurmPair, len(pairs))}
		for i, kv := range pairs {
			sl.Pairs[i] = SlurmPair{Key: kv.key, Value: kv.val}
		}
		out = append(out, sl)
	}
	return out
}

// confLine is one logical line of a Slurm configuration file: comments
// removed, continuations joined, escapes resolved.
type confLine struct {
	line int // first physical line
	text string
}

// slurmLines splits data as Slurm's parser does.
func slurmLines(data []byte) []confLine {
	var out []confLine
	var cur strings.Builder
	start, continuing := 0, false
	for i, raw := range strings.Split(string(data), "\n") {
		s := stripComment(strings.TrimSuffix(raw, "\r"))
		if !continuing {
			start = i + 1
		}
		if cut, ok := continuation(s); ok {
			cur.WriteString(s[:cut])
			continuing = true
			continue
		}
		cur.WriteString(s)
		out = append(out, confLine{line: start, text: unescape(cur.String())})
		cur.Reset()
		continuing = false
	}
	if continuing {
		out = append(out, confLine{line: start, text: unescape(cur.String())})
	}
	return out
}

// stripComment cuts s at the first '#' not escaped by a backslash.
func stripComment(s string) string {
	bs := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '#':
			if bs%2 == 0 {
				return s[:i]
			}
			bs = 0
		case '\\':
			bs++
		default:
			bs = 0
		}
	}
	return s
}

// continuation reports whether s ends in an odd number of backslashes
// (white space after them allowed) and where the last one is.
func continuation(s string) (int, bool) {
	i := len(s) - 1
	for i >= 0 && isSpace(s[i]) {
		i--
	}
	end, bs := i, 0
	for i >= 0 && s[i] == '\\' {
		bs++
		i--
	}
	return end, bs%2 == 1
}

// unescape drops each backslash and keeps the character after it.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
			if i == len(s) {
				break
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f' || c == '\n'
}

// keyValue is one Key=Value of a line.
type keyValue struct {
	key, val string
}

// splitPairs reads Key=Value pairs: keys of letters, digits, '_' and '.',
// white space allowed around '=', values unquoted (no white space) or in
// double quotes. A value left empty before the next Key=Value is empty.
// example is a line of the file's kind, quoted in the syntax error.
func splitPairs(s, example string) ([]keyValue, error) {
	var out []keyValue
	i := 0
	for {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i == len(s) {
			return out, nil
		}
		start := i
		for i < len(s) && isKeyChar(s[i]) {
			i++
		}
		key := s[start:i]
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, fmt.Errorf("syntax: expected Key=Value pairs such as %s, got %q", example, abbreviate(strings.TrimSpace(s[start:])))
		}
		i++
		afterEq := i
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if next := nextToken(s[i:]); strings.Contains(next, "=") && !strings.HasPrefix(next, `"`) {
			// "Nodes= Switches=x": Nodes is empty, not "Switches=x" (no
			// value read here may hold '=').
			i = afterEq
		}
		var val string
		if i < len(s) && s[i] == '"' {
			end := strings.IndexByte(s[i+1:], '"')
			if end < 0 {
				return nil, fmt.Errorf("%s: expected a closing '\"', got %q", key, abbreviate(s[i:]))
			}
			val = s[i+1 : i+1+end]
			i += end + 2
			if i < len(s) && !isSpace(s[i]) {
				return nil, fmt.Errorf("%s: expected white space after the quoted value, got %q", key, abbreviate(s[i:]))
			}
		} else {
			start := i
			for i < len(s) && !isSpace(s[i]) {
				i++
			}
			val = s[start:i]
		}
		out = append(out, keyValue{key: key, val: val})
	}
}

// nextToken returns s up to its first white space.
func nextToken(s string) string {
	for i := 0; i < len(s); i++ {
		if isSpace(s[i]) {
			return s[:i]
		}
	}
	return s
}

func isKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.'
}
