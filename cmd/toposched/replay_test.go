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
