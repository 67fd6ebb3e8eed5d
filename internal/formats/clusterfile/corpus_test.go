package clusterfile

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toposched/toposched/internal/formats/nccltests"
)

// sharedTestdata is ../shared/testdata beside the repository, or "" when
// this checkout has none (a fresh clone: the project's own copies of the
// files its tests need are in each package's testdata).
func sharedTestdata(t *testing.T) string {
	t.Helper()
	for dir, _ := os.Getwd(); dir != filepath.Dir(dir); dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "..", "shared", "testdata")
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				return p
			}
			return ""
		}
	}
	return ""
}

// TestSharedCorpus runs every topology dump and every nccl-tests file of
// ../shared/testdata (real files nobody here wrote) through its importer:
// a complete file imports, a cut-off one (*.partial.*) is refused naming
// its file and line, and nothing panics. Files added there later are
// covered without a change here.
func TestSharedCorpus(t *testing.T) {
	root := sharedTestdata(t)
	if root == "" {
		t.Skip("no ../shared/testdata beside this checkout (a fresh clone): the importers' own tests cover the project's copies")
	}
	t.Parallel()
	count := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		name := d.Name()
		partial := strings.Contains(name, ".partial.")
		switch {
		case strings.HasPrefix(rel, "topologies"+string(filepath.Separator)) && (strings.HasSuffix(name, ".txt") || strings.HasSuffix(name, ".xml")):
			count++
			_, err := LoadNodeFile(p, NodeFileOptions{})
			switch {
			case err != nil && !partial:
				t.Errorf("%s: %v", rel, err)
			case err != nil && !strings.Contains(err.Error(), name):
				t.Errorf("%s: refused without naming the file: %v", rel, err)
			}
		case strings.HasPrefix(rel, "nccl-tests"+string(filepath.Separator)) && strings.HasSuffix(name, ".txt"):
			count++
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if _, err := nccltests.Parse(name, data); err != nil && !strings.HasPrefix(err.Error(), name) {
				t.Errorf("%s: refused without naming the file: %v", rel, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if count == 0 {
		t.Fatalf("no files under %s", root)
	}
	t.Logf("%d files of %s through their importers", count, root)
}
