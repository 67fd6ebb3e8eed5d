package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func runPolicy(args ...string) (string, error) {
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestPolicyTest(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr bool
		want    []string
	}{
		{"shipped set", []string{"policy", "test"}, false, []string{"PASS  toposched.placement.tp_nvlink_test.test_two_islands_denied (tp_nvlink_test.rego:10)", " passed, 0 failed"}},
		{"shipped dir", []string{"policy", "test", "../../policies/default"}, false, []string{"PASS ", "../../policies/default/leaf_span_test.rego:5", " passed, 0 failed"}},
		{"failing test", []string{"policy", "test", "../../policies/testdata/failing"}, true, []string{"FAIL  toposched.nodes.always_test.test_fails (../../policies/testdata/failing/always_test.rego:9)", "1 passed, 1 failed"}},
		{"forbidden built-in", []string{"policy", "test", "../../policies/testdata/forbidden"}, true, []string{"../../policies/testdata/forbidden/http.rego:4: rego_type_error: undefined function http.send"}},
		{"syntax error", []string{"policy", "test", "../../policies/testdata/syntax"}, true, []string{"../../policies/testdata/syntax/broken.rego:", "rego_parse_error"}},
		{"missing dir", []string{"policy", "test", "no/such/dir"}, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runPolicy(tc.args...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v\n%s", err, tc.wantErr, out)
			}
			text := out
			if err != nil {
				text += err.Error()
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("output lacks %q:\n%s", w, text)
				}
			}
		})
	}
}

func TestPolicyTestJSON(t *testing.T) {
	out, err := runPolicy("policy", "test", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Revision string
		Passed   int
		Failed   int
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Revision) != 64 || v.Passed == 0 || v.Failed != 0 {
		t.Errorf("%+v %v\n%s", v, err, out)
	}
}
