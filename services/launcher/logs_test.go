package launcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/toposched/toposched/events"
)

// tailFile runs a tailer over content written to a file before it starts,
// stopped at once: it reads everything, then flushes.
func tailFile(t *testing.T, content string, lineBytes int, budget int64, fail func(*events.RankLog) bool) []*events.RankLog {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rank-0.log")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	var got []*events.RankLog
	tl := &tailer{job: "j", rank: 0, node: "n", lineBytes: lineBytes, budget: budget,
		publish: func(_ context.Context, ev *events.RankLog) error {
			if fail != nil && fail(ev) {
				return errors.New("no NATS")
			}
			c := *ev
			c.Lines = slices.Clone(ev.Lines)
			got = append(got, &c)
			return nil
		}}
	stop := make(chan struct{})
	close(stop)
	tl.run(context.Background(), path, 0, stop)
	return got
}

func allLines(evs []*events.RankLog) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Lines...)
	}
	return out
}

func TestTailer(t *testing.T) {
	t.Parallel()
	many := strings.Repeat("x\n", 600)
	for _, tc := range []struct {
		name        string
		content     string
		lineBytes   int
		budget      int64
		fail        func(*events.RankLog) bool
		wantLines   []string
		wantEvents  int
		wantDropped int64
	}{
		{name: "lines and an unterminated last one", content: "a\r\nb\n\nlast", lineBytes: 100, budget: 1000,
			wantLines: []string{"a", "b", "", "last"}, wantEvents: 1},
		{name: "long lines cut", content: "abcdefgh\nxy\n", lineBytes: 3, budget: 1000,
			wantLines: []string{"abc", "xy"}, wantEvents: 1},
		{name: "batches of at most 256 lines", content: many, lineBytes: 10, budget: 1 << 20,
			wantLines: slices.Repeat([]string{"x"}, 600), wantEvents: 3},
		{name: "budget spent: the rest is dropped and counted", content: "aaaa\nbbbb\ncccc\ndddd\n", lineBytes: 10, budget: 8,
			wantLines: []string{"aaaa", "bbbb"}, wantEvents: 1},
		{name: "invalid UTF-8 replaced", content: "ok\xff\n", lineBytes: 10, budget: 100,
			wantLines: []string{"ok\uFFFD"}, wantEvents: 1},
		{name: "nothing written", content: "", lineBytes: 10, budget: 100, wantEvents: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := tailFile(t, tc.content, tc.lineBytes, tc.budget, tc.fail)
			if lines := allLines(got); !slices.Equal(lines, tc.wantLines) {
				t.Errorf("lines %q, want %q", lines, tc.wantLines)
			}
			if len(got) != tc.wantEvents {
				t.Errorf("%d events, want %d", len(got), tc.wantEvents)
			}
			for i, e := range got {
				if e.Seq != int64(i+1) {
					t.Errorf("event %d has seq %d", i, e.Seq)
				}
			}
		})
	}
}

// A batch that could not be sent is counted as dropped in the next one.
func TestTailerCountsWhatItCouldNotSend(t *testing.T) {
	t.Parallel()
	tl := &tailer{job: "j", node: "n", lineBytes: 100, budget: 1000}
	var got []*events.RankLog
	failing := true
	tl.publish = func(_ context.Context, ev *events.RankLog) error {
		if failing {
			return errors.New("no NATS")
		}
		c := *ev
		got = append(got, &c)
		return nil
	}
	tl.send(context.Background(), tl.split(nil, []byte("a\nb\n")))
	failing = false
	tl.send(context.Background(), tl.split(nil, []byte("c\n")))
	if len(got) != 1 || got[0].Dropped != 2 || !slices.Equal(got[0].Lines, []string{"c"}) {
		t.Fatalf("got %+v, want one event with c and 2 dropped", got)
	}
}

// FuzzTailerSplit: whatever a rank writes, in whatever pieces, the events
// are valid UTF-8 lines within the limits, and nothing is both sent and
// counted as dropped.
func FuzzTailerSplit(f *testing.F) {
	f.Add([]byte("hello\nworld\n"), 3, 5)
	f.Add([]byte("no newline at all"), 1, 4)
	f.Add([]byte("\n\n\r\n\xff\xfe\n"), 2, 1)
	f.Add([]byte(strings.Repeat("long line ", 100)+"\n"), 7, 16)
	f.Fuzz(func(t *testing.T, data []byte, cut, lineBytes int) {
		lineBytes = 1 + abs(lineBytes)%64
		cut = abs(cut) % (len(data) + 1)
		tl := &tailer{job: "j", node: "n", lineBytes: lineBytes, budget: 1 << 20}
		lines := tl.split(nil, data[:cut])
		lines = tl.split(lines, data[cut:])
		if len(tl.partial) > 0 {
			lines = tl.keep(lines, tl.partial)
		}
		want := strings.Count(string(data), "\n")
		if len(data) > 0 && data[len(data)-1] != '\n' {
			want++
		}
		if len(lines) != want {
			t.Fatalf("%d lines from %q, want %d", len(lines), data, want)
		}
		for _, l := range lines {
			if !utf8.ValidString(l) || strings.Contains(l, "\n") {
				t.Fatalf("line %q", l)
			}
			if utf8.RuneCountInString(l) > lineBytes { // each byte read is at most one rune
				t.Fatalf("line %q longer than %d", l, lineBytes)
			}
		}
	})
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}
