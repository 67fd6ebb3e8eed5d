package main

import (
	"slices"
	"strings"
	"testing"
)

func TestReplayStrategies(t *testing.T) {
	for _, tc := range []struct {
		strategy, compare string
		want              []string
		err               string
	}{
		{strategy: "blind", want: []string{"blind"}},
		{strategy: "topology-aware", compare: "aware,blind,binpack,gpuallocator,random",
			want: []string{"topology-aware", "blind", "binpack", "gpuallocator", "random"}},
		{strategy: "topology-aware", compare: "spread, blind", want: []string{"spread", "blind"}},
		{strategy: "topology-aware", compare: "aware,topology-aware", err: "--compare: topology-aware is listed twice"},
		{strategy: "topology-aware", compare: "aware,exhaustive", err: `--compare: strategy "exhaustive": expected`},
		{strategy: "fastest", err: `--strategy: strategy "fastest": expected`},
	} {
		got, err := replayStrategies(replayFlags{strategy: tc.strategy, compare: tc.compare})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q/%q: error %v, want %q", tc.strategy, tc.compare, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%q/%q: %v, %v; want %v", tc.strategy, tc.compare, got, err, tc.want)
		}
	}
}

func TestComputeReferenceFlags(t *testing.T) {
	for _, tc := range []struct {
		compute, ref, want, err string
	}{
		{compute: "blind", ref: "a100", want: ""},
		{compute: "per-model", ref: "a100", want: "a100"},
		{compute: "per-model", ref: "V100-SXM2-32GB", want: "V100-SXM2-32GB"},
		{compute: "per-model", ref: "MI300X", err: `--compute-reference "MI300X" is no GPU model the table knows`},
		{compute: "charge-only", ref: "t4", want: "t4"},
		{compute: "fast", ref: "a100", err: `--compute "fast": expected blind, per-model or charge-only`},
	} {
		got, err := computeReference(replayFlags{compute: tc.compute, computeReference: tc.ref})
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s/%s: error %v, want %q", tc.compute, tc.ref, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s/%s: %q, %v; want %q", tc.compute, tc.ref, got, err, tc.want)
		}
	}
}
