package main

import (
	"log/slog"
	"math"
	"runtime/debug"
	"testing"
)

// --memory-limit sets the runtime's soft limit; 0 lifts it; without it
// GOMEMLIMIT, else defaultMemoryLimit; a size that is none is refused.
func TestApplyMemoryLimit(t *testing.T) {
	was := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(was) })
	log := slog.New(slog.DiscardHandler)
	for _, tc := range []struct {
		flag, env string
		want      int64
	}{
		{"768MiB", "", 768 << 20},
		{"2G", "", 2 << 30},
		{"0", "", math.MaxInt64},
		{"", "", defaultMemoryLimit},
	} {
		t.Setenv("GOMEMLIMIT", tc.env)
		f := opsFlags{memoryLimit: tc.flag}
		if err := f.applyMemoryLimit(log); err != nil {
			t.Fatalf("%q: %v", tc.flag, err)
		}
		if got := debug.SetMemoryLimit(-1); got != tc.want {
			t.Errorf("--memory-limit %q: limit %d, want %d", tc.flag, got, tc.want)
		}
	}
	if err := (&opsFlags{memoryLimit: "lots"}).applyMemoryLimit(log); err == nil {
		t.Error("--memory-limit lots accepted")
	}
}
