package launcher

import (
	"bytes"
	"context"
	"io"
	"os"
	"time"

	"github.com/toposched/toposched/events"
)

// Limits of the log stream, so that a rank printing without end cannot
// fill the runtime stream or flood topoctl run.
const (
	// DefaultLogLineBytes cuts longer lines (the rest is dropped).
	DefaultLogLineBytes = 4096
	// DefaultLogBytesPerRank is what one rank may send in all; beyond it
	// lines are counted as dropped, and the file in the state directory
	// keeps everything.
	DefaultLogBytesPerRank = 8 << 20
	// logBatchLines and logBatchBytes bound one rank_log event.
	logBatchLines = 256
	logBatchBytes = 64 << 10
	// logPoll is how often a rank's output file is read.
	logPoll = 100 * time.Millisecond
)

// tailer reads one rank's output file as it grows and publishes it as
// runtime.rank_log batches, at most one batch per poll.
type tailer struct {
	job       string
	rank      int
	node      string
	lineBytes int
	budget    int64
	publish   func(context.Context, *events.RankLog) error

	seq     int64
	sent    int64
	dropped int64
	partial []byte
}

// run tails path from offset until stop is closed, then reads what is left,
// flushes a last unterminated line and returns.
func (t *tailer) run(ctx context.Context, path string, offset int64, stop <-chan struct{}) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer func() { _ = f.Close() }() // read only: nothing to lose
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return
	}
	tick := time.NewTicker(logPoll)
	defer tick.Stop()
	buf := make([]byte, 64<<10)
	for {
		stopped := false
		select {
		case <-stop:
			stopped = true
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		var lines []string
		for {
			n, err := f.Read(buf)
			lines = t.split(lines, buf[:n])
			if n == 0 || err != nil {
				break
			}
		}
		if stopped && len(t.partial) > 0 {
			lines = t.keep(lines, t.partial)
			t.partial = nil
		}
		t.send(ctx, lines)
		if stopped {
			return
		}
	}
}

// split cuts data into lines, carrying an unterminated end to the next call.
func (t *tailer) split(lines []string, data []byte) []string {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			if len(t.partial) < t.lineBytes {
				t.partial = append(t.partial, data[:min(len(data), t.lineBytes-len(t.partial))]...)
			}
			return lines
		}
		line := data[:i]
		if len(t.partial) > 0 {
			line = append(t.partial, line[:min(len(line), max(0, t.lineBytes-len(t.partial)))]...)
			t.partial = nil
		}
		lines = t.keep(lines, line)
		data = data[i+1:]
	}
	return lines
}

// keep adds a line, cut to the line limit, unless the rank's budget is spent.
func (t *tailer) keep(lines []string, line []byte) []string {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) > t.lineBytes {
		line = line[:t.lineBytes]
	}
	if t.sent+int64(len(line)) > t.budget {
		t.dropped++
		return lines
	}
	t.sent += int64(len(line))
	return append(lines, string(bytes.ToValidUTF8(line, []byte("\uFFFD"))))
}

// send publishes lines in batches within the event's bounds. A failed
// publish loses its batch (counted as dropped): the rank must not wait on
// its logs.
func (t *tailer) send(ctx context.Context, lines []string) {
	for len(lines) > 0 || t.dropped > 0 {
		n, size := 0, 0
		for n < len(lines) && n < logBatchLines && size+len(lines[n]) <= logBatchBytes {
			size += len(lines[n])
			n++
		}
		if n == 0 && len(lines) > 0 {
			n = 1 // a line longer than a batch (a line limit above it)
		}
		t.seq++
		ev := &events.RankLog{JobID: t.job, Rank: t.rank, Node: t.node, Seq: t.seq, Lines: lines[:n], Dropped: t.dropped}
		if ev.Lines == nil {
			ev.Lines = []string{}
		}
		if err := t.publish(ctx, ev); err != nil {
			t.dropped += int64(n)
		} else {
			t.dropped = 0
		}
		lines = lines[n:]
		if len(lines) == 0 {
			return
		}
	}
}
