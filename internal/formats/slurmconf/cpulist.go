package slurmconf

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// MaxCPU bounds a CPU or core number in a list: no node has more, and the
// bound keeps a typo such as 0-4000000000 from exhausting memory.
const MaxCPU = 1<<16 - 1

// ParseCPUList reads a Linux or Slurm CPU list ("0-3,8,10-11"): numbers and
// ranges lo-hi, comma separated. It returns the numbers sorted, each once.
func ParseCPUList(s string) ([]int, error) {
	if s == "" {
		return nil, fmt.Errorf("expected a list such as 0-3,8, got nothing")
	}
	// Ranges first, merged, then expanded: a list repeating 0-65535 costs
	// its length, not 65536 numbers a part.
	var ranges [][2]int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		l, err := cpuNumber(lo)
		if err != nil {
			return nil, fmt.Errorf("expected a list such as 0-3,8, got %q: %w", abbreviate(s), err)
		}
		h, err := cpuNumber(hi)
		if err != nil {
			return nil, fmt.Errorf("expected a list such as 0-3,8, got %q: %w", abbreviate(s), err)
		}
		if l > h {
			return nil, fmt.Errorf("expected a list such as 0-3,8, got %q: range %s is reversed", abbreviate(s), part)
		}
		ranges = append(ranges, [2]int{l, h})
	}
	slices.SortFunc(ranges, func(a, b [2]int) int { return a[0] - b[0] })
	var out []int
	next := 0 // the lowest number not yet in out
	for _, r := range ranges {
		for n := max(r[0], next); n <= r[1]; n++ {
			out = append(out, n)
		}
		next = max(next, r[1]+1)
	}
	return out, nil
}

func cpuNumber(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a number", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > MaxCPU {
		return 0, fmt.Errorf("%s is beyond %d", s, MaxCPU)
	}
	return n, nil
}

// FormatCPUList writes sorted, distinct numbers as a list of ranges
// ("0-3,8").
func FormatCPUList(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(cpus[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return b.String()
}

// abbreviate shortens a long value for an error message.
func abbreviate(s string) string {
	const most = 80
	if len(s) <= most {
		return s
	}
	return s[:most] + "..."
}
