package client

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestYAMLToJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src, want, wantErr string
	}{
		{name: "numbers as written", src: "a: 8.0\nb: 7e9\nc: 1e30\nd: -0.0\ne: 9223372036854775807\n",
			want: `{"a":8.0,"b":7e9,"c":1e30,"d":-0.0,"e":9223372036854775807}`},
		{name: "yaml's spellings", src: "a: 0x1F\nb: 0o17\nc: +5\nd: .5\ne: 1_000\n", want: `{"a":31,"b":15,"c":5,"d":0.5,"e":1000}`},
		{name: "json", src: `{"job_id": "a", "gpus": 8.0, "labels": {"x.y": "z"}}`, want: `{"job_id":"a","gpus":8.0,"labels":{"x.y":"z"}}`},
		{name: "strings and scalars", src: "a: yes\nb: '8'\nc: true\nd: null\ne: ~\nf: 2025-03-14T09:26:53Z\n",
			want: `{"a":"yes","b":"8","c":true,"d":null,"e":null,"f":"2025-03-14T09:26:53Z"}`},
		{name: "anchors and merges", src: "base: &b {tp: 8, pp: 2}\njob:\n  <<: *b\n  pp: 4\nlist: [*b]\n",
			want: `{"base":{"tp":8,"pp":2},"job":{"pp":4,"tp":8},"list":[{"tp":8,"pp":2}]}`},
		{name: "merge of a list", src: "a: &a {x: 1}\nb: &b {x: 2, y: 3}\nc: {<<: [*a, *b]}\n",
			want: `{"a":{"x":1},"b":{"x":2,"y":3},"c":{"x":1,"y":3}}`},
		{name: "number keys are strings", src: "1: a\n2.5: b\n", want: `{"1":"a","2.5":"b"}`},
		{name: "empty", src: "", want: `null`},
		{name: "infinity", src: "a:\n  b: [1, .inf]\n", wantErr: "a.b[1] is not a finite number: .inf"},
		{name: "not a number", src: "a: .nan\n", wantErr: "a is not a finite number: .nan"},
		{name: "list key", src: "? [1, 2]\n: x\n", wantErr: "a key must be a string"},
		{name: "bad merge", src: "a: {<<: 3}\n", wantErr: "a: a merge key (<<) takes a mapping"},
		{name: "alias bomb", src: bomb(), wantErr: "more than one message holds"},
		{name: "not yaml", src: "a: [", wantErr: "yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := YAMLToJSON([]byte(tc.src))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("YAMLToJSON = %s, %v; want an error saying %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("YAMLToJSON =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// bomb is a few hundred bytes of YAML whose aliases expand past any message.
func bomb() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [" + strings.Repeat(`"xxxxxxxxxxxxxxxx",`, 9) + `"x"]` + "\n")
	for i := 1; i < 9; i++ {
		prev := "*a" + string(rune('0'+i-1))
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [" + strings.Repeat(prev+",", 9) + prev + "]\n")
	}
	return b.String()
}

// TestYAMLToJSONAgreesWithYAML: for the sample jobs and the cluster file,
// the JSON holds what yaml.v3 reads, numbers as numbers.
func TestYAMLToJSONAgreesWithYAML(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("../../deploy/examples/jobs/*.yaml")
	files = append(files, "../../deploy/examples/cluster.yaml")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := YAMLToJSON(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var viaYAML any
		if err := yaml.Unmarshal(data, &viaYAML); err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(viaYAML)
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatalf("%s: not JSON: %v", f, err)
		}
		_ = json.Unmarshal(want, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s:\nYAMLToJSON %s\nyaml.v3    %s", f, got, want)
		}
	}
}
