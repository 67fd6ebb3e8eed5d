package events

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	jsonv1 "github.com/go-json-experiment/json/v1"
)

// TestDecodeEngines holds DecodeJSON's fast path, go-json-experiment's
// v1, to encoding/json: on every schema example of every event, valid and
// invalid, both take the same bodies and make the same values of them.
// (FuzzDecodeJSON checks the same on whatever it generates.)
func TestDecodeEngines(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "schemas", "v1", "examples")
	checked := 0
	for _, name := range Catalogue {
		dir := filepath.Join(root, string(name))
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
				return err
			}
			body, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			checked++
			std, fast := newDecodeTarget(name), newDecodeTarget(name)
			errStd, errFast := json.Unmarshal(body, std), jsonv1.Unmarshal(body, fast)
			if (errStd == nil) != (errFast == nil) {
				t.Errorf("%s: encoding/json says %v, jsonv1 %v", path, errStd, errFast)
			} else if errStd == nil && !reflect.DeepEqual(std, fast) {
				t.Errorf("%s: encoding/json made %+v, jsonv1 %+v", path, std, fast)
			}
			return nil
		})
		if err != nil && !os.IsNotExist(err) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if checked < 100 {
		t.Fatalf("checked %d examples: where are the schemas' examples?", checked)
	}
}

// newDecodeTarget is name.New(), but jobs.analyzed in its wire form: its
// UnmarshalJSON decodes with DecodeJSON, which would compare the fast
// path with itself.
func newDecodeTarget(name Name) any {
	if name == NameJobAnalyzed {
		return new(jobAnalyzedWire)
	}
	return name.New()
}

// BenchmarkDecode decodes the full example of the events a decision's
// path decodes, with encoding/json and with DecodeJSON, side by side.
func BenchmarkDecode(b *testing.B) {
	for _, name := range []Name{NameJobSubmitted, NameJobAnalyzed, NamePlacementDecided} {
		body, err := os.ReadFile(filepath.Join("..", "schemas", "v1", "examples", string(name), "full.json"))
		if err != nil {
			b.Fatal(err)
		}
		for _, engine := range []struct {
			name   string
			decode func([]byte, any) error
		}{{"encoding-json", json.Unmarshal}, {"DecodeJSON", DecodeJSON}} {
			b.Run(string(name)+"/"+engine.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(body)))
				for b.Loop() {
					if err := engine.decode(body, name.New()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
