package fabric

import (
	"slices"
	"strings"
	"testing"
)

func TestExpandHostlist(t *testing.T) {
	t.Parallel()
	cat := func(parts ...[]string) []string { return slices.Concat(parts...) }
	tests := []struct {
		expr string
		want []string
	}{
		{"a", []string{"a"}},
		{"a,b", []string{"a", "b"}},
		{"a, b\tc", []string{"a", "b", "c"}},
		{"a,,b,", []string{"a", "b"}},
		{"s[0-2]", []string{"s0", "s1", "s2"}},
		{"node[1-3,7,10-12]", []string{"node1", "node2", "node3", "node7", "node10", "node11", "node12"}},
		{"circe-n[001-098]", seq("circe-n", 1, 98, 3)},
		{"circe-n[001-016],n[019-020]", cat(seq("circe-n", 1, 16, 3), []string{"n019", "n020"})},
		{"circe-n[040,060,062-077]", cat([]string{"circe-n040", "circe-n060"}, seq("circe-n", 62, 77, 3))},
		{"rack[1-2]-n[01-04]", cat(seq("rack1-n", 1, 4, 2), seq("rack2-n", 1, 4, 2))},
		{"a[1-2]b[3-4]c", []string{"a1b3c", "a1b4c", "a2b3c", "a2b4c"}},
		{"[1-3]", []string{"1", "2", "3"}},
		{"n[8-11]", []string{"n8", "n9", "n10", "n11"}},
		{"n[08-11]", []string{"n08", "n09", "n10", "n11"}},
		{"n[98-100]x", []string{"n98x", "n99x", "n100x"}},
		{"n[5]", []string{"n5"}},
		{"n[3-3]", []string{"n3"}},
		{"abacusc-[0-2],abacusc-neta", []string{"abacusc-0", "abacusc-1", "abacusc-2", "abacusc-neta"}},
		{"n[1-2],n1", []string{"n1", "n2", "n1"}}, // duplicates are kept
		{"dev[0-5]", seq("dev", 0, 5, 1)},
		{"n[18446744073709551614-18446744073709551615]", []string{"n18446744073709551614", "n18446744073709551615"}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			t.Parallel()
			got, err := ExpandHostlist(tt.expr)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ExpandHostlist(%q) =\n%q\nwant\n%q", tt.expr, got, tt.want)
			}
		})
	}
}

func TestExpandHostlistErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, expr, want string
	}{
		{"empty", "", "names nothing"},
		{"only commas", " , ,", "names nothing"},
		{"unclosed", "n[1-3", "'[' at offset 1 is not closed"},
		{"unopened", "n1-3]", "']' without '[' at offset 4"},
		{"nested", "n[1-[2]]", "nested '[' at offset 4"},
		{"empty bracket", "n[]", `got ""`},
		{"empty range part", "n[1,]", `got ""`},
		{"open range", "n[1-]", `got "1-"`},
		{"reversed", "n[5-3]", "range 5-3 is reversed"},
		{"letters", "n[a-c]", `expected digits in a range, got "a"`},
		{"negative", "n[-1-3]", `got "-1-3"`},
		{"two dashes", "n[1-2-3]", `expected digits in a range, got "2-3"`},
		{"space in bracket", "n[1, 2]", `expected digits in a range, got " 2"`},
		{"too big number", "n[1-99999999999999999999]", "number 99999999999999999999 is too large"},
		{"huge range", "n[0-1048576]", "range 0-1048576 expands to more than 1048576 names"},
		{"huge product", "n[1-1024]x[1-1025]", "the expression expands to more than 1048576 names"},
		{"huge sum", "a[1-1000000],b[1-100000]", "the expression expands to more than 1048576 names"},
		{"huge bracket sum", "a[1-600000,1-600000]", "[1-600000,1-600000] expands to more than 1048576 names"},
		{"full uint64", "n[0-18446744073709551615]", "expands to more than"},
		{"long name", strings.Repeat("x", 256), "names longer than 255 characters"},
		{"long expanded name", strings.Repeat("x", 250) + "[1-100000]", "names longer than 255 characters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ExpandHostlist(tt.expr)
			if err == nil {
				t.Fatalf("ExpandHostlist(%q) = %d names, want an error with %q", tt.expr, len(got), tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ExpandHostlist(%q): error %q does not contain %q", tt.expr, err, tt.want)
			}
		})
	}
}

func TestExpandHostlistAtLimit(t *testing.T) {
	t.Parallel()
	got, err := ExpandHostlist("n[1-1048576]")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxHostlistNames || got[0] != "n1" || got[len(got)-1] != "n1048576" {
		t.Errorf("got %d names, %q ... %q", len(got), got[0], got[len(got)-1])
	}
}

func TestCompressHostlist(t *testing.T) {
	t.Parallel()
	tests := []struct {
		names []string
		want  string
	}{
		{[]string{"a"}, "a"},
		{[]string{"n1"}, "n1"},
		{[]string{"n1", "n2"}, "n[1-2]"},
		{[]string{"n1", "n2", "n3", "n7"}, "n[1-3,7]"},
		{[]string{"n08", "n09", "n10"}, "n[08-10]"},
		{[]string{"n8", "n9", "n10", "n11"}, "n[8-11]"},
		{[]string{"n9", "n010"}, "n[9,010]"},
		{[]string{"a", "b8", "b9", "b10"}, "a,b[8-10]"},
		{[]string{"n2", "n1"}, "n[2,1]"}, // order kept
		{[]string{"n1", "n1"}, "n[1,1]"}, // duplicates kept
		{[]string{"n1", "m1", "n2"}, "n1,m1,n2"},
		{[]string{"rack1-n01", "rack1-n02", "rack2-n01"}, "rack1-n[01-02],rack2-n01"},
		{[]string{"s", "s1"}, "s,s1"},
		{[]string{"1", "2"}, "[1-2]"},
		{seq("circe-n", 1, 98, 3), "circe-n[001-098]"},
		{[]string{"n1234567890123456789"}, "n1234567890123456789"}, // too long to count
		{nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			got := CompressHostlist(tt.names)
			if got != tt.want {
				t.Errorf("CompressHostlist(%q) = %q, want %q", tt.names, got, tt.want)
			}
			if len(tt.names) == 0 {
				return
			}
			back, err := ExpandHostlist(got)
			if err != nil || !slices.Equal(back, tt.names) {
				t.Errorf("ExpandHostlist(%q) = %q, %v; want %q", got, back, err, tt.names)
			}
		})
	}
}
