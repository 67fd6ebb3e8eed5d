package pattern

import (
	"reflect"
	"strings"
	"testing"

	"github.com/toposched/toposched/events"
)

func TestGroups(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		p    events.Parallelism
		want map[string][][]int
	}{
		{
			name: "data parallel only",
			p:    events.Parallelism{TP: 1, PP: 1, CP: 1, EP: 1, DP: 4},
			want: map[string][][]int{"dp": {{0, 1, 2, 3}}},
		},
		{
			name: "tp 2 dp 2: tp groups are consecutive ranks",
			p:    events.Parallelism{TP: 2, PP: 1, CP: 1, EP: 1, DP: 2},
			want: map[string][][]int{"tp": {{0, 1}, {2, 3}}, "dp": {{0, 2}, {1, 3}}},
		},
		{
			// Megatron-LM's documented example: 16 GPUs, tp 2, pp 4, dp 2.
			name: "megatron 3d",
			p:    events.Parallelism{TP: 2, PP: 4, CP: 1, EP: 1, DP: 2},
			want: map[string][][]int{
				"tp": {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}},
				"dp": {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}},
				"pp": {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}},
			},
		},
		{
			name: "experts inside data parallel",
			p:    events.Parallelism{TP: 1, PP: 1, CP: 1, EP: 2, DP: 4},
			want: map[string][][]int{"ep": {{0, 1}, {2, 3}}, "dp": {{0, 1, 2, 3}}},
		},
		{
			name: "context parallel between tp and dp",
			p:    events.Parallelism{TP: 2, PP: 1, CP: 2, EP: 1, DP: 2},
			want: map[string][][]int{
				"tp": {{0, 1}, {2, 3}, {4, 5}, {6, 7}},
				"cp": {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
				"dp": {{0, 4}, {1, 5}, {2, 6}, {3, 7}},
			},
		},
		{name: "one GPU has no groups", p: events.Parallelism{TP: 1, PP: 1, CP: 1, EP: 1, DP: 1}, want: map[string][][]int{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := map[string][][]int{}
			for _, g := range Groups(tc.p) {
				got[g.Dimension] = g.Members
				if len(g.Members[0]) != g.Size {
					t.Errorf("%s: size %d, members of %d", g.Dimension, g.Size, len(g.Members[0]))
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Groups(%+v) =\n%v\nwant\n%v", tc.p, got, tc.want)
			}
		})
	}
}

// Every rank belongs to exactly one group of each dimension.
func TestGroupsPartitionRanks(t *testing.T) {
	t.Parallel()
	p := events.Parallelism{TP: 4, PP: 3, CP: 2, EP: 2, DP: 6}
	n := p.TP * p.PP * p.CP * p.DP
	for _, g := range Groups(p) {
		seen := make([]int, n)
		for _, m := range g.Members {
			for _, r := range m {
				seen[r]++
			}
		}
		for r, c := range seen {
			if c != 1 {
				t.Fatalf("%s: rank %d in %d groups", g.Dimension, r, c)
			}
		}
	}
}

func TestResolve(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		job        events.JobSubmitted
		want       events.Parallelism
		wantFields []string
		wantText   string
	}{
		{name: "defaults: dp is everything", job: events.JobSubmitted{GPUs: 8},
			want: events.Parallelism{TP: 1, PP: 1, DP: 8, EP: 1, CP: 1}},
		{name: "dp derived", job: events.JobSubmitted{GPUs: 16, Parallelism: &events.Parallelism{TP: 8}},
			want: events.Parallelism{TP: 8, PP: 1, DP: 2, EP: 1, CP: 1}},
		{name: "explicit and consistent", job: events.JobSubmitted{GPUs: 16, Parallelism: &events.Parallelism{TP: 2, PP: 4, DP: 2}},
			want: events.Parallelism{TP: 2, PP: 4, DP: 2, EP: 1, CP: 1}},
		{name: "product differs", job: events.JobSubmitted{GPUs: 8, Parallelism: &events.Parallelism{TP: 4, PP: 2, DP: 2}},
			wantFields: []string{"parallelism"}, wantText: "4·2·2·1 = 16, but gpus = 8"},
		{name: "dp not derivable", job: events.JobSubmitted{GPUs: 12, Parallelism: &events.Parallelism{TP: 8}},
			wantFields: []string{"gpus"}, wantText: "not a multiple of tp·pp·cp"},
		{name: "ep must divide dp", job: events.JobSubmitted{GPUs: 6, Parallelism: &events.Parallelism{EP: 4}},
			wantFields: []string{"parallelism.ep"}, wantText: "ep = 4 must divide dp = 6"},
		{name: "gpus per node must divide gpus", job: events.JobSubmitted{GPUs: 12, GPUsPerNode: 8},
			wantFields: []string{"gpus_per_node"}},
		{name: "every problem at once", job: events.JobSubmitted{GPUs: 10, GPUsPerNode: 4, Parallelism: &events.Parallelism{TP: 2, DP: 4, EP: 3}},
			wantFields: []string{"parallelism", "parallelism.ep", "gpus_per_node"}},
		{name: "too many GPUs", job: events.JobSubmitted{GPUs: MaxGPUs + 1}, wantFields: []string{"gpus"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, reasons := Resolve(tc.job)
			var fields []string
			var text strings.Builder
			for _, r := range reasons {
				fields = append(fields, r.Field)
				text.WriteString(r.Message + "\n")
			}
			if !reflect.DeepEqual(fields, tc.wantFields) {
				t.Fatalf("fields %v, want %v (%s)", fields, tc.wantFields, text.String())
			}
			if tc.wantText != "" && !strings.Contains(text.String(), tc.wantText) {
				t.Errorf("messages %q do not say %q", text.String(), tc.wantText)
			}
			if len(reasons) == 0 && got != tc.want {
				t.Errorf("Resolve = %+v, want %+v", got, tc.want)
			}
		})
	}
}
