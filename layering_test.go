// The floor order of the house, checked on the import graph go list reports.
package toposched_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/toposched/toposched"

// floors ranks each top-level directory: a package may import one on its
// own floor or below, never above (docs/concepts.md, Architecture). The
// order is cmd → sim → services → internal → policies, metrics → events →
// schemas; e2e drives the commands, so it sits on top; deploy/examples is
// embedded data and docs a test of the Markdown links: neither imports
// anything of toposched, so both sit on the ground floor with schemas.
var floors = map[string]int{
	"":         9, // this test
	"e2e":      8,
	"cmd":      7,
	"sim":      6,
	"services": 5,
	"internal": 4,
	"policies": 3,
	"metrics":  3,
	"events":   2,
	"schemas":  1,
	"deploy":   1,
	"docs":     1,
}

// testReach lists the test imports that may reach a higher floor: a
// contract checked from below, where moving the test up would split it
// from the helpers it shares with the package's own tests. Production code
// has no such exception.
var testReach = map[[2]string]string{
	{"schemas", "events"}: "every event in events.Catalogue has a schema, and every valid example decodes into its Go type",
}

// listed is what the test reads of go list -json.
type listed struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

func TestFloorOrder(t *testing.T) {
	pkgs := goList(t)
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed no package")
	}
	for _, p := range pkgs {
		from, ok := floorOf(p.ImportPath)
		if !ok {
			t.Errorf("%s is on no floor: give its top-level directory a place in floors", p.ImportPath)
			continue
		}
		check := func(imports []string, test bool) {
			for _, imp := range imports {
				to, ok := floorOf(imp)
				if !ok || to <= from {
					continue
				}
				if _, allowed := testReach[[2]string{rel(p.ImportPath), rel(imp)}]; test && allowed {
					continue
				}
				what := "imports"
				if test {
					what = "tests import"
				}
				t.Errorf("%s (floor %d) %s %s (floor %d): a lower floor never imports a higher one",
					rel(p.ImportPath), from, what, rel(imp), to)
			}
		}
		check(p.Imports, false)
		check(p.TestImports, true)
		check(p.XTestImports, true)
	}
}

// The exceptions name pairs that exist and still reach up: a stale one
// would hide nothing today and let the next one in unseen.
func TestFloorOrderExceptionsUsed(t *testing.T) {
	used := map[[2]string]bool{}
	for _, p := range goList(t) {
		for _, imp := range append(append([]string{}, p.TestImports...), p.XTestImports...) {
			used[[2]string{rel(p.ImportPath), rel(imp)}] = true
		}
	}
	for pair, why := range testReach {
		if !used[pair] {
			t.Errorf("testReach lists %s → %s (%s), but no test there imports it: remove the entry", pair[0], pair[1], why)
		}
		from, _ := floorOf(module + "/" + pair[0])
		to, _ := floorOf(module + "/" + pair[1])
		if to <= from {
			t.Errorf("testReach lists %s → %s, which does not reach up: remove the entry", pair[0], pair[1])
		}
	}
}

// goList lists every package of the module with its imports.
func goList(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", "./...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listed
	d := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		err := d.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("read go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// rel is a module package's path inside the module.
func rel(path string) string {
	return strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
}

// floorOf is the floor of a package of the module; ok is false for one
// outside it (the standard library, dependencies), and for a module
// package whose top-level directory has no floor.
func floorOf(path string) (floor int, ok bool) {
	if path != module && !strings.HasPrefix(path, module+"/") {
		return 0, false
	}
	top, _, _ := strings.Cut(rel(path), "/")
	floor, ok = floors[top]
	return floor, ok
}
