package nccltests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join("testdata", "aws-p4de-a100_2node-16gpu-efa_all_reduce_awsome-distributed-training.txt")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(file, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Rows) < 20 {
		t.Fatalf("%d rows", len(r.Rows))
	}
	last := r.Rows[len(r.Rows)-1]
	if last.Bytes < 1<<30 || last.BusBW() <= 0 || last.Type != "float" {
		t.Fatalf("last row %+v", last)
	}
}

const row = "  134217728      33554432     float     sum      -1   3912.9   34.30   64.31      0   3932.8   34.13   63.99      0\n"

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"empty", "", []string{"f.txt", "no rows"}},
		{"prose only", "# nThread 1 nGpus 8\nhello\n", []string{"no rows"}},
		{"cut off", row + "  268435456      67108864     float     sum      -1   7201.7   37.27\n", []string{"f.txt:2:", "cut off"}},
		{"negative time", strings.Replace(row, "3912.9", "-3912.9", 1), []string{"f.txt:1:", "time", "positive"}},
		{"zero time", strings.Replace(row, "3932.8", "0", 1), []string{"f.txt:1:", "positive"}},
		{"negative busbw", strings.Replace(row, "64.31", "-64.31", 1), []string{"f.txt:1:", "busbw"}},
		{"not a number", strings.Replace(row, "64.31", "N/A", 1), []string{"f.txt:1:", "field 8", `"N/A"`}},
		{"NaN", strings.Replace(row, "63.99", "NaN", 1), []string{"f.txt:1:", "field 12"}},
		{"sizes shrink", row + row, []string{"f.txt:2:", "grow"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("f.txt", []byte(tc.in))
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
	r, err := Parse("f.txt", []byte("# nThread 1 nGpus 8 minBytes 8\n0: "+row))
	if err != nil || r.GPUs != 8 || len(r.Rows) != 1 || r.Rows[0].Line != 2 {
		t.Fatalf("rank prefix and header: %+v %v", r, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(row))
	f.Add([]byte("# nThread 1 nGpus 8\n0: " + row))
	f.Add([]byte(row + "  268435456      67108864     float     sum      -1   7201.7"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse("f.txt", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.txt") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for i, row := range r.Rows {
			if row.Bytes <= 0 || row.TimeOutUS <= 0 || row.TimeInUS <= 0 || row.BusBW() < 0 || (i > 0 && row.Bytes <= r.Rows[i-1].Bytes) {
				t.Fatalf("row %+v taken", row)
			}
		}
	})
}
