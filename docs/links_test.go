package docs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestLinksResolve checks every relative link of the repository's own
// Markdown (the front door, the benchmarks, the reference pages, the READMEs
// beside the code; not testdata or third_party): the file it names exists
// inside the repository, and its #anchor is a heading there by GitHub's
// rule. Links with a scheme (https:, mailto:) are not fetched: CI has no
// network.
func TestLinksResolve(t *testing.T) {
	root := os.DirFS("..")
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "BENCHMARKS.md", "docs/concepts.md"} {
		if !slices.Contains(files, want) {
			t.Fatalf("%s is not among the files checked %q: the reference has moved or the test runs from the wrong directory", want, files)
		}
	}
	for _, b := range checkLinks(root, files) {
		t.Error(b)
	}
}

// markdownFiles lists the .md files of the repository, leaving out test
// inputs (testdata, whose broken links are on purpose), vendored code
// (third_party: upstream's links) and hidden directories.
func markdownFiles(fsys fs.FS) ([]string, error) {
	var files []string
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := path.Base(name)
		if d.IsDir() && name != "." && (base == "testdata" || base == "third_party" || strings.HasPrefix(base, ".")) {
			return fs.SkipDir
		}
		if !d.IsDir() && path.Ext(name) == ".md" {
			files = append(files, name)
		}
		return nil
	})
	return files, err
}

// TestCheckLinksFindsBroken holds the checker to what it must catch, so a
// checker that finds nothing cannot pass TestLinksResolve by accident.
func TestCheckLinksFindsBroken(t *testing.T) {
	root := os.DirFS("testdata/links")
	var got []string
	for _, b := range checkLinks(root, []string{"page.md", "missing.md"}) {
		got = append(got, b.String())
	}
	want := []string{
		"page.md:10: gone.md: no such file",
		"page.md:11: other.md#no-such-heading: no heading in other.md has the anchor no-such-heading",
		"page.md:12: #also-missing: no heading in page.md has the anchor also-missing",
		"page.md:13: ../outside.md: leaves the repository",
		"page.md:14: other.md#Two-Words: no heading in other.md has the anchor Two-Words",
		"page.md:15: sub/code.go#main: sub/code.go is not Markdown: only line anchors (#L12) can be checked there",
		"page.md:19: gone-too.md: no such file",
		"page.md:23: #repeated-2: no heading in page.md has the anchor repeated-2",
		"page.md:27: gone-wrapped.md: no such file",
		"page.md:34: #setext-heading-1: no heading in page.md has the anchor setext-heading-1",
		"missing.md: no such file",
	}
	if !slices.Equal(got, want) {
		t.Errorf("broken links:\n got %q\nwant %q", got, want)
	}
}

func TestSlug(t *testing.T) {
	tests := []struct{ heading, want string }{
		{"Two commands", "two-commands"},
		{"Delivery, durability and restarts", "delivery-durability-and-restarts"},
		{"Decision latency through the planner: `toposched load`", "decision-latency-through-the-planner-toposched-load"},
		{"Issue 17: best fit within a tolerance — what a placement costs", "issue-17-best-fit-within-a-tolerance--what-a-placement-costs"},
		{"Target 1: 1,000 one-GPU pods at ≥ 100 pods/s", "target-1-1000-one-gpu-pods-at--100-podss"},
		{"The [cost model](cost-model.md) and *its* floors", "the-cost-model-and-its-floors"},
		{"snake_case stays", "snake_case-stays"},
		{"Après coup", "après-coup"},
	}
	for _, tt := range tests {
		if got := slug(tt.heading); got != tt.want {
			t.Errorf("slug(%q) = %q, want %q", tt.heading, got, tt.want)
		}
	}
}

// brokenLink is one link that does not resolve; line is 0 when the file
// itself could not be read.
type brokenLink struct {
	file   string
	line   int
	link   string
	reason string
}

func (b brokenLink) String() string {
	if b.line == 0 {
		return fmt.Sprintf("%s: %s", b.file, b.reason)
	}
	return fmt.Sprintf("%s:%d: %s: %s", b.file, b.line, b.link, b.reason)
}

// page is what the checker needs of one Markdown file.
type page struct {
	anchors map[string]bool
	links   []link
}

type link struct {
	line   int
	target string
}

var (
	atxHeading    = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextLine    = regexp.MustCompile(`^ {0,3}(?:=+|-+)[ \t]*$`)
	fence         = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")
	inlineLink    = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	referenceDef  = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	scheme        = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	lineAnchor    = regexp.MustCompile(`^L[0-9]+(?:-L[0-9]+)?$`)
	markdownLinks = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// parse reads a Markdown file's headings (as GitHub's anchors) and links,
// skipping fenced code, where `# comment` is not a heading and [x](y) no
// link. Links are looked for a paragraph at a time, code spans blanked out
// first, since both a link's text and a code span may wrap onto the next
// line.
func parse(fsys fs.FS, name string) (page, error) {
	data, err := fs.ReadFile(fsys, name)
	if err != nil {
		return page{}, err
	}
	p := page{anchors: map[string]bool{}}
	occurrences := map[string]int{}
	addAnchor := func(text string) {
		// GitHub numbers repeated headings x, x-1, x-2 (github-slugger).
		s := slug(text)
		a := s
		for _, taken := occurrences[a]; taken; _, taken = occurrences[a] {
			occurrences[s]++
			a = fmt.Sprintf("%s-%d", s, occurrences[s])
		}
		occurrences[a] = 0
		p.anchors[a] = true
	}
	var para []string // the paragraph being read
	paraLine := 0     // the line number of its first line
	flush := func() {
		text := blankCodeSpans(strings.Join(para, "\n"))
		for _, m := range inlineLink.FindAllStringSubmatchIndex(text, -1) {
			p.links = append(p.links, link{line: paraLine + strings.Count(text[:m[0]], "\n"), target: text[m[2]:m[3]]})
		}
		for i, l := range strings.Split(text, "\n") {
			if m := referenceDef.FindStringSubmatch(l); m != nil {
				p.links = append(p.links, link{line: paraLine + i, target: m[1]})
			}
		}
		para = nil
	}
	var open string // the fence that opened the current code block
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSuffix(line, "\r")
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case open == "":
				flush()
				open = m[1]
			case m[1][0] == open[0] && len(m[1]) >= len(open) && strings.TrimSpace(line) == m[1]:
				open = ""
			}
			continue
		}
		if open != "" {
			continue
		}
		switch m := atxHeading.FindStringSubmatch(line); {
		case m != nil:
			flush()
			addAnchor(m[1])
		case setextLine.MatchString(line) && len(para) > 0:
			// The paragraph above an === or --- line is a heading.
			addAnchor(strings.TrimSpace(strings.Join(para, " ")))
			para = nil
		case strings.TrimSpace(line) == "":
			flush()
		default:
			if len(para) == 0 {
				paraLine = i + 1
			}
			para = append(para, line)
		}
	}
	flush()
	return p, nil
}

// blankCodeSpans turns every code span of text into spaces, keeping its
// newlines, so that a [x](y) quoted in code is no link. A span closes on the
// next run of as many backticks as opened it; a run with no match is
// literal.
func blankCodeSpans(text string) string {
	b := []byte(text)
	run := func(i int) int {
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		return n
	}
	for i := 0; i < len(b); {
		n := run(i)
		if n == 0 {
			i++
			continue
		}
		end := -1
		for j := i + n; j < len(b); {
			if m := run(j); m > 0 {
				if m == n {
					end = j + m
					break
				}
				j += m
				continue
			}
			j++
		}
		if end < 0 {
			i += n
			continue
		}
		for k := i; k < end; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end
	}
	return string(b)
}

// slug is GitHub's anchor for a heading: its rendered text in lower case,
// with everything but letters, digits, marks, '_', '-' and spaces dropped and
// each space a '-' (github-slugger, which GitHub's renderer follows).
func slug(heading string) string {
	text := markdownLinks.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// checkLinks returns every link of files (paths in fsys, which is the
// repository root) that does not resolve.
func checkLinks(fsys fs.FS, files []string) []brokenLink {
	pages := map[string]page{}
	load := func(name string) (page, error) {
		if p, ok := pages[name]; ok {
			return p, nil
		}
		p, err := parse(fsys, name)
		if err == nil {
			pages[name] = p
		}
		return p, err
	}
	var broken []brokenLink
	for _, file := range files {
		p, err := load(file)
		if errors.Is(err, fs.ErrNotExist) {
			broken = append(broken, brokenLink{file: file, reason: "no such file"})
			continue
		}
		if err != nil {
			broken = append(broken, brokenLink{file: file, reason: err.Error()})
			continue
		}
		for _, l := range p.links {
			if reason := resolve(fsys, file, l.target, load); reason != "" {
				broken = append(broken, brokenLink{file: file, line: l.line, link: l.target, reason: reason})
			}
		}
	}
	return broken
}

// resolve says why target, a link in file, does not resolve, or "" when it
// does.
func resolve(fsys fs.FS, file, target string, load func(string) (page, error)) string {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return ""
	}
	ref, anchor, _ := strings.Cut(target, "#")
	ref, err := url.PathUnescape(ref)
	if err != nil {
		return fmt.Sprintf("bad escape in the path: %v", err)
	}
	if anchor, err = url.PathUnescape(anchor); err != nil {
		return fmt.Sprintf("bad escape in the anchor: %v", err)
	}
	name := file
	if ref != "" {
		if strings.HasPrefix(ref, "/") {
			name = path.Clean(strings.TrimPrefix(ref, "/"))
		} else {
			name = path.Join(path.Dir(file), ref)
		}
		if name == ".." || strings.HasPrefix(name, "../") {
			return "leaves the repository"
		}
		info, err := fs.Stat(fsys, name)
		if errors.Is(err, fs.ErrNotExist) {
			return "no such file"
		}
		if err != nil {
			return err.Error()
		}
		if info.IsDir() {
			if anchor != "" {
				return fmt.Sprintf("%s is a directory: it has no anchors", name)
			}
			return ""
		}
	}
	if anchor == "" {
		return ""
	}
	if filepath.Ext(name) != ".md" {
		if lineAnchor.MatchString(anchor) {
			return ""
		}
		return fmt.Sprintf("%s is not Markdown: only line anchors (#L12) can be checked there", name)
	}
	p, err := load(name)
	if err != nil {
		return err.Error()
	}
	if !p.anchors[anchor] {
		return fmt.Sprintf("no heading in %s has the anchor %s", name, anchor)
	}
	return ""
}
