package replay

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// golden compares got with testdata/golden/name, or rewrites it.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update)", err, t.Name())
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n got: %s\nwant: %s", name, got, want)
	}
}

func readFile(t *testing.T, name string) ([]byte, string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data, name
}

func TestReadersGolden(t *testing.T) {
	for _, tc := range []struct {
		file string
		read func(string, io.Reader) (*Trace, error)
	}{
		{"alibaba_pods.csv", ReadAlibabaPods},
		{"alibaba_pods_untimed.csv", ReadAlibabaPods},
		{"itp.csv", ReadITP},
		{"philly.csv", ReadPhilly},
		{"helios.csv", ReadHelios},
	} {
		t.Run(tc.file, func(t *testing.T) {
			data, name := readFile(t, tc.file)
			tr, err := tc.read(name, bytes.NewReader(data))
			if err != nil {
				t.Fatal(err)
			}
			if tr.Records != len(tr.Jobs)+tr.SkippedTotal() {
				t.Errorf("records %d != jobs %d + skipped %d", tr.Records, len(tr.Jobs), tr.SkippedTotal())
			}
			out, err := json.MarshalIndent(tr, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			golden(t, strings.TrimSuffix(tc.file, ".csv")+".json", append(out, '\n'))
		})
	}
}

func TestReadAlibabaNodesGolden(t *testing.T) {
	data, name := readFile(t, "alibaba_nodes.csv")
	nodes, notes, err := ReadAlibabaNodes(name, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c := AlibabaCluster(nodes, name)
	if err := c.Write(&buf); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("# notes: " + strings.Join(notes, "; ") + "\n")
	golden(t, "alibaba_cluster.yaml", buf.Bytes())
	// The generated file is one discovery accepts.
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	if err := c.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	inv, err := LoadInventory(path)
	if err != nil {
		t.Fatal(err)
	}
	if inv.GPUs != 22 || len(inv.Nodes) != 4 || inv.MaxNodeGPUs != 8 {
		t.Errorf("inventory: %d GPUs on %d nodes (max %d), want 22 on 4 (max 8)", inv.GPUs, len(inv.Nodes), inv.MaxNodeGPUs)
	}
}

// TestReaderErrors: every problem names file:line and the column.
func TestReaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		read func(string, io.Reader) (*Trace, error)
		in   string
		want []string
	}{
		{"pods missing column", ReadAlibabaPods, "name,num_gpu\np,1\n", []string{"x.csv:1: header: missing column gpu_milli"}},
		{"pods deletion without creation", ReadAlibabaPods, "name,num_gpu,gpu_milli,creation_time\np,1,1000,5\n",
			[]string{"x.csv:1: header: missing column deletion_time"}},
		{"pods bad number", ReadAlibabaPods, "name,num_gpu,gpu_milli\np,one,1000\nq,1,2000\n",
			[]string{"x.csv:2: num_gpu: expected a whole number, got \"one\"", "x.csv:3: gpu_milli: expected 0 to 1000, got 2000"}},
		{"pods share of several GPUs", ReadAlibabaPods, "name,num_gpu,gpu_milli\np,2,500\n",
			[]string{"x.csv:2: gpu_milli: a share of a GPU (500) with num_gpu 2"}},
		{"pods duplicate", ReadAlibabaPods, "name,num_gpu,gpu_milli\np,1,1000\np,1,1000\n",
			[]string{"x.csv:3: name: pod \"p\" already listed on line 2"}},
		{"pods bad name", ReadAlibabaPods, "name,num_gpu,gpu_milli\n-p,1,1000\n", []string{"x.csv:2: name: expected a pod name"}},
		{"itp bad duration", ReadITP, "job_id,submission_time,duration,num_gpu\nj,1,five,1\n",
			[]string{"x.csv:2: duration: expected a number, got \"five\""}},
		{"itp wrong field count", ReadITP, "job_id,submission_time,duration,num_gpu\nj,1,\"5,1\n",
			[]string{"x.csv:2:"}},
		{"philly bad time", ReadPhilly, "timestamp,duration,num_gpus\nyesterday,1,1\n",
			[]string{"x.csv:2: timestamp: expected a time like 2017-10-09 07:01:55, got \"yesterday\""}},
		{"philly NaN", ReadPhilly, "timestamp,duration,num_gpus\n2017-10-09 07:01:55,NaN,1\n",
			[]string{"x.csv:2: duration: expected a number, got \"NaN\""}},
		{"helios missing", ReadHelios, "u_id,gpu_num\n1,1\n", []string{"x.csv:1: header: missing column node_num, interval, run_time"}},
		{"helios fraction", ReadHelios, "u_id,gpu_num,node_num,interval,run_time\n1,1.5,1,0,1\n",
			[]string{"x.csv:2: gpu_num: expected a whole number, got \"1.5\""}},
		{"empty", ReadITP, "", []string{"x.csv:1: header: the file is empty"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.read("x.csv", strings.NewReader(tc.in))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestReadAlibabaNodesErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"sn,gpu\nn,1\n", "x.csv:1: header: missing column model"},
		{"sn,gpu,model\nn,8,\n", "x.csv:2: model: expected a GPU model for a node with 8 GPUs"},
		{"sn,gpu,model\nn,1,T4\nn,1,T4\n", "x.csv:3: sn: node \"n\" already listed on line 2"},
		{"sn,gpu,model\nn,0,\n", "x.csv: no node with GPUs"},
	} {
		_, _, err := ReadAlibabaNodes("x.csv", strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
}

// The fuzz targets check that no input makes a reader panic, and that a
// trace it accepts accounts for every record.
func fuzzReader(f *testing.F, read func(string, io.Reader) (*Trace, error), seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := read("fuzz.csv", bytes.NewReader(data))
		if err != nil {
			return
		}
		if tr.Records != len(tr.Jobs)+tr.SkippedTotal() {
			t.Errorf("records %d != jobs %d + skipped %d", tr.Records, len(tr.Jobs), tr.SkippedTotal())
		}
		for _, j := range tr.Jobs {
			if j.GPUs < 1 || !jobIDPattern.MatchString(j.ID) || j.Arrival < 0 || !finite(j.Duration) {
				t.Errorf("bad job %+v", j)
			}
			// Only untimed pods run until the end; a job log's negative
			// durations are skipped.
			if tr.Kind != KindAlibaba && j.Duration < 0 {
				t.Errorf("job %s kept with duration %v", j.ID, j.Duration)
			}
		}
	})
}

func FuzzReadAlibabaPods(f *testing.F) {
	data, _ := os.ReadFile("testdata/alibaba_pods.csv")
	fuzzReader(f, ReadAlibabaPods, string(data), "name,num_gpu,gpu_milli\np,1,500\n", "name,num_gpu,gpu_milli,creation_time,deletion_time\n")
}

func FuzzReadITP(f *testing.F) {
	data, _ := os.ReadFile("testdata/itp.csv")
	fuzzReader(f, ReadITP, string(data), "job_id,submission_time,duration,num_gpu\nj,1e3,2.5,8\n",
		"job_id,submission_time,duration,num_gpu\na,10,,1\nb,9,-1,2\nc,8,3,0\nd,7,3,4\n")
}

func FuzzReadPhilly(f *testing.F) {
	data, _ := os.ReadFile("testdata/philly.csv")
	fuzzReader(f, ReadPhilly, string(data), "timestamp,duration,num_gpus\n2017-10-09 07:01:55,1,1\n\n\n",
		"timestamp,duration,num_gpus\n2017-10-09 07:01:55,,1\n2017-10-09 06:01:55,-4,2\n")
}

func FuzzReadHelios(f *testing.F) {
	data, _ := os.ReadFile("testdata/helios.csv")
	fuzzReader(f, ReadHelios, string(data), "u_id,gpu_num,node_num,interval,run_time\n1,16,3,0,1\n",
		"u_id,gpu_num,node_num,interval,run_time\n1,1,1,0,\n2,2,1,-5,3\n3,4,1,2,-1\n")
}

func FuzzReadAlibabaNodes(f *testing.F) {
	data, _ := os.ReadFile("testdata/alibaba_nodes.csv")
	f.Add(data)
	f.Add([]byte("sn,gpu,model\nn,300,T4\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		nodes, _, err := ReadAlibabaNodes("fuzz.csv", bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, n := range nodes {
			if n.GPUs < 1 || n.GPUModel == "" || !nodeNamePattern.MatchString(n.Name) {
				t.Errorf("bad node %+v", n)
			}
		}
	})
}

// TestReaderSkips: records that are well-formed but cannot be replayed
// (no duration, a negative one, no GPU, out of order, an end before the
// start) are counted by reason and left out, and every record is a job or
// a skip.
func TestReaderSkips(t *testing.T) {
	for _, tc := range []struct {
		name string
		read func(string, io.Reader) (*Trace, error)
		in   string
		jobs int
		want map[string]int
	}{
		{"itp", ReadITP, "job_id,submission_time,duration,num_gpu\n" +
			"a,10,5,1\nb,11,,2\nc,12,-3,1\nd,13,4,0\ne,9,4,8\nf,14,4,8\n",
			2, map[string]int{SkipNoDuration: 1, SkipNegativeDuration: 1, SkipNoGPU: 1, SkipOutOfOrder: 1}},
		{"philly (not in time order: sorted, not skipped)", ReadPhilly, "timestamp,duration,num_gpus\n" +
			"2017-10-09 07:01:55,66,1\n2017-10-09 06:01:55,,1\n2017-10-09 05:01:55,-1,4\n2017-10-09 04:01:55,7,0\n2017-10-09 03:01:55,7,2\n",
			2, map[string]int{SkipNoDuration: 1, SkipNegativeDuration: 1, SkipNoGPU: 1}},
		{"helios", ReadHelios, "u_id,gpu_num,node_num,interval,run_time\n" +
			"1,1,1,0,5\n2,2,1,-4,5\n3,2,1,5,\n4,0,1,1,3\n5,8,1,2,-2\n6,8,1,3,9\n",
			2, map[string]int{SkipOutOfOrder: 1, SkipNoDuration: 1, SkipNoGPU: 1, SkipNegativeDuration: 1}},
		{"alibaba", ReadAlibabaPods, "name,num_gpu,gpu_milli,creation_time,deletion_time,scheduled_time\n" +
			"p,1,1000,100,50,100\nq,1,1000,100,150,120\n",
			1, map[string]int{SkipEndsBeforeStart: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := tc.read("x.csv", strings.NewReader(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Jobs) != tc.jobs || tr.Records != len(tr.Jobs)+tr.SkippedTotal() {
				t.Errorf("%d jobs of %d records, %d skipped; want %d jobs", len(tr.Jobs), tr.Records, tr.SkippedTotal(), tc.jobs)
			}
			if !maps.Equal(tr.Skipped, tc.want) {
				t.Errorf("skipped %v, want %v", tr.Skipped, tc.want)
			}
		})
	}
}
