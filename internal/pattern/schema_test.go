package pattern

import (
	"encoding/json"
	"testing"

	"github.com/toposched/toposched/schemas"
)

// TestBoundsMatchSchema: the bounds analysis checks are the ones the
// schemas publish, so a publisher that meets the schema meets analysis.
func TestBoundsMatchSchema(t *testing.T) {
	t.Parallel()
	read := func(name string) map[string]any {
		t.Helper()
		b, err := schemas.Schema(name)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		return doc
	}
	at := func(doc any, path ...string) any {
		for _, p := range path {
			m, ok := doc.(map[string]any)
			if !ok {
				return nil
			}
			doc = m[p]
		}
		return doc
	}
	labels := at(read(schemas.Common), "$defs", "labels")
	groups := at(read("jobs.submitted"), "properties", "groups")
	byModel := at(read("jobs.submitted"), "properties", "step_compute_seconds_by_model")
	for _, tc := range []struct {
		name string
		got  any
		want int
	}{
		{"labels maxProperties", at(labels, "maxProperties"), MaxLabels},
		{"label key maxLength", at(labels, "propertyNames", "maxLength"), MaxLabelKeyLength},
		{"label value maxLength", at(labels, "additionalProperties", "maxLength"), MaxLabelValueLength},
		{"groups maxItems", at(groups, "maxItems"), MaxGroups},
		{"step_compute_seconds_by_model maxProperties", at(byModel, "maxProperties"), MaxComputeModels},
		{"group ranks maxItems", at(groups, "items", "properties", "ranks", "maxItems"), MaxGPUs},
	} {
		if f, ok := tc.got.(float64); !ok || int(f) != tc.want {
			t.Errorf("schema %s = %v, analysis bounds it at %d", tc.name, tc.got, tc.want)
		}
	}
}
