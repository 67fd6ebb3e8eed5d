package fabric

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/toposched/toposched/events"
)

// TestGolden renders what each parser makes of each test data file (or the
// error it reports) and compares it with testdata/golden/<name>.golden; run
// with -update to rewrite them after checking the difference.
func TestGolden(t *testing.T) {
	t.Parallel()
	slurm := func(path string, from, to int) func(t *testing.T) (events.TopologyFabric, error) {
		return func(t *testing.T) (events.TopologyFabric, error) {
			data := readFile(t, path)
			if from > 0 {
				data = lines(data, from, to)
			}
			return ParseSlurm(filepath.Base(path), data)
		}
	}
	tests := []struct {
		name  string
		parse func(t *testing.T) (events.TopologyFabric, error)
	}{
		{"slurm-circe", slurm(circeFile, 0, 0)},
		{"slurm-puppet", slurm(puppetFile, 0, 0)},
		{"slurm-unsw-abacus", slurm(unswFile, 0, 0)},
		{"slurm-schedmd", slurm(schedmdFile, 0, 0)},
		{"slurm-schedmd-tree", slurm(schedmdFile, 1, 4)},
		{"slurm-schedmd-block", slurm(schedmdFile, 6, 14)},
		{"slurm-schedmd-ring", slurm(schedmdFile, 16, 21)},
		{"clos-lingjun", func(t *testing.T) (events.TopologyFabric, error) {
			return ParseClosCSV(filepath.Base(lingjunFile), readFile(t, lingjunFile))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fab, err := tt.parse(t)
			if err == nil {
				checkFabric(t, fab)
			}
			got := render(fab, err)
			golden := filepath.Join("testdata", "golden", tt.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("rendering differs from %s (run with -update to accept):\n%s", golden, got)
			}
		})
	}
}
