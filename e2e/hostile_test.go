package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// serveRSSBound is the most resident memory `toposched serve` may reach
// (its VmHWM), with --memory-limit serveMemoryLimit, while it answers the
// hostile bodies of TestServeBoundsHostileBodies: three bursts of twelve,
// 27 MB a burst (docs/security.md gives the figures
// measured: about 58 MB after start-up and one job, about 410 MB after the
// bursts; 570 MB without a limit). Most of it is the embedded NATS
// server's: it copies each 8 MB message several times on its way (read,
// store, deliver) and keeps what it stored in the last ten seconds in
// memory. Before the bounds of issue 46, one 8 MB body of four million
// numbers took serve from 192 MB to 24 GB.
const serveRSSBound = 576 << 20

// serveMemoryLimit is serve's --memory-limit in the tests that bound its
// memory: without a soft limit the collector let the garbage of the
// bodies' copies double the heap before it ran (570-730 MB); the limit is
// what an operator sets for the host serve runs on (default 1 GiB).
const serveMemoryLimit = "384MiB"

// hostileRounds is how many times each hostile body is sent.
const hostileRounds = 3

// hostileBody is one body a careless or hostile publisher sends on
// jobs.submitted, with the job id in its ce-subject header.
type hostileBody struct {
	id   string
	body []byte
}

// hostileBodies are issue 46's bodies for round r: an args of four
// million numbers under max_payload, an array nested a million deep, a
// body a kilobyte under max_payload, 400,000 unknown properties, and
// bodies of random hostile parts.
func hostileBodies(r int, rng *rand.Rand) []hostileBody {
	const maxPayload = 8 << 20 // the embedded server's, as serve runs it
	var args bytes.Buffer
	fmt.Fprintf(&args, `{"job_id":"h-args-%d","gpus":1,"args":[`, r)
	for args.Len() < maxPayload-2<<10 {
		args.WriteString("0,")
	}
	args.WriteString("0]}")
	var props bytes.Buffer
	fmt.Fprintf(&props, `{"job_id":"h-props-%d","gpus":1`, r)
	for i := range 400_000 {
		fmt.Fprintf(&props, `,"p%d":1`, i)
	}
	props.WriteString("}")
	out := []hostileBody{
		{fmt.Sprintf("h-args-%d", r), args.Bytes()},
		{fmt.Sprintf("h-deep-%d", r), []byte(strings.Repeat("[", 1_000_000) + strings.Repeat("]", 1_000_000))},
		{fmt.Sprintf("h-near-%d", r), []byte(fmt.Sprintf(`{"job_id":"h-near-%d","gpus":1,"tenant":"%s"}`, r,
			strings.Repeat("t", maxPayload-1<<10)))},
		{fmt.Sprintf("h-props-%d", r), props.Bytes()},
	}
	for i := range 8 {
		id := fmt.Sprintf("h-fuzz-%d-%d", r, i)
		// gpus 0 keeps every one invalid, whatever the parts make of the
		// rest.
		body := fmt.Sprintf(`{"job_id":"%s","gpus":0,"labels":%s,"args":%s,"groups":%s}`, id,
			hostilePart(rng, 0), hostilePart(rng, 0), hostilePart(rng, 0))
		out = append(out, hostileBody{id, []byte(body)})
	}
	return out
}

// hostilePart is a random JSON value of the kinds that cost a reader:
// deep nesting, long arrays and objects, repeated names, numbers past any
// range, long and escaped strings, bytes that are not UTF-8.
func hostilePart(rng *rand.Rand, depth int) string {
	if depth > 70 {
		return "0"
	}
	switch rng.IntN(9) {
	case 0:
		n := rng.IntN(70) + 1
		return strings.Repeat("[", n) + hostilePart(rng, depth+n) + strings.Repeat("]", n)
	case 1:
		return "[" + strings.TrimSuffix(strings.Repeat("1e999999,", rng.IntN(50_000)+1), ",") + "]"
	case 2:
		var b strings.Builder
		b.WriteString("{")
		for i := range rng.IntN(20_000) + 1 {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"k%d":%s`, rng.IntN(100), strconv.Quote(strings.Repeat("v", rng.IntN(8))))
		}
		return b.String() + "}"
	case 3:
		return `"` + strings.Repeat(`\u00e9\ud83d\ude00\"`, rng.IntN(100_000)+1) + `"`
	case 4:
		return `"` + string([]byte{0xff, 0xfe, 'x', 0xc3}) + strings.Repeat("z", rng.IntN(1<<20)) + `"`
	case 5:
		return "[" + strings.TrimSuffix(strings.Repeat(`{"name":"g","ranks":[-1,1.5,1e400]},`, rng.IntN(10_000)+1), ",") + "]"
	case 6:
		return `{"` + strings.Repeat("n", rng.IntN(1<<20)) + `":1}`
	case 7:
		return "[" + hostilePart(rng, depth+1) + "," + hostilePart(rng, depth+1) + "]"
	}
	return `{"a":` + hostilePart(rng, depth+1) + `,"a":2}`
}

// TestServeBoundsHostileBodies sends issue 46's hostile bodies to a real
// `toposched serve` again and again: its resident memory stays under
// serveRSSBound, every body is answered by one placement.rejected and
// kept in one dead letter, no message is delivered twice, and a job sent
// after them is placed.
func TestServeBoundsHostileBodies(t *testing.T) {
	needBinaries(t)
	if runtime.GOOS != "linux" {
		t.Skip("reads serve's memory from /proc")
	}
	t.Parallel()
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	serve := startServe(t, "serve", testdata(t, "two-nodes.yaml"), port, t.TempDir(), "--memory-limit", serveMemoryLimit)
	js := jsConnect(t, url)
	waitFor(t, 30*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamTopology, durablePlacementTopology, 2)
	})
	submitWaitDecided(t, url, writeJob(t, t.TempDir(), "before", 8), "before")
	rss, hwm := memoryOf(t, serve)
	t.Logf("serve after start-up and one job: VmRSS %d MB, VmHWM %d MB", rss>>20, hwm>>20)

	rng := rand.New(rand.NewPCG(46, 2026))
	var sent []string // job ids
	size := map[string]int{}
	for r := range hostileRounds {
		for _, h := range hostileBodies(r, rng) {
			m := nats.NewMsg(subjectSubmitted)
			m.Header.Set("ce-subject", h.id)
			m.Data = h.body
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := js.PublishMsg(ctx, m)
			cancel()
			if err != nil {
				t.Fatalf("publish %s (%d bytes): %v", h.id, len(h.body), err)
			}
			sent = append(sent, h.id)
			size[h.id] = len(h.body)
		}
		rss, peak := memoryOf(t, serve)
		t.Logf("serve after round %d (%d bodies): VmRSS %d MB, VmHWM %d MB", r, len(sent), rss>>20, peak>>20)
	}

	// All of them at once, a flood: with the soft memory limit and each
	// pull bounded by bytes, the peak no longer follows the rate (without
	// them the 36 at once took serve to 780-950 MB, 490-590 MB a burst at
	// a time).
	waitFor(t, 120*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		return consumerDrained(js, streamJobs, durableAnalysis, uint64(len(sent)+1))
	})
	// Measured before the checks below, which read the streams through
	// serve's NATS server (it loads what it stored to answer).
	_, hwm = memoryOf(t, serve)
	t.Logf("serve's peak after %d hostile bodies (%d rounds): VmHWM %d MB (bound %d MB)",
		len(sent), hostileRounds, hwm>>20, serveRSSBound>>20)
	if hwm > serveRSSBound {
		t.Errorf("serve reached %d MB resident (VmHWM), over the bound of %d MB", hwm>>20, serveRSSBound>>20)
	}

	// Each is answered once: the analysis consumer took every message
	// once, one rejection and one dead letter each.
	if ci, err := consumerInfo(js, streamJobs, durableAnalysis); err != nil || ci.NumRedelivered != 0 {
		t.Errorf("analysis consumer: %v", describeRedelivered(ci, err))
	}
	rejections := map[string]int{}
	waitFor(t, 60*time.Second, func() (bool, string) {
		mustBeAlive(t, serve)
		clear(rejections)
		for _, ev := range readPlacements(t, js) {
			if ev.subject == subjectRejected {
				rejections[ev.jobID]++
			}
		}
		for _, id := range sent {
			if rejections[id] == 0 {
				return false, id + " has no rejection yet"
			}
		}
		return true, ""
	})
	dead := deadLetters(t, js)
	for _, id := range sent {
		d := dead[id]
		if rejections[id] != 1 || d.count != 1 {
			t.Errorf("%s: %d rejections and %d dead letters, want one each", id, rejections[id], d.count)
		}
		// The body is kept whole, or, where it does not fit beside the
		// dead letter's headers (h-near), as its first bytes, its size and
		// its digest.
		whole := d.kept == size[id] && d.size == ""
		summary := d.size == strconv.Itoa(size[id]) && d.kept <= 4<<10
		if !whole && !summary || strings.HasPrefix(id, "h-near-") && !summary {
			t.Errorf("%s: dead letter of %d bytes, toposched-dead-size %q; want the %d bytes, or the first 4 KiB of them",
				id, d.kept, d.size, size[id])
		}
	}

	// Still serving.
	submitWaitDecided(t, url, writeJob(t, t.TempDir(), "after", 8), "after")
}

// memoryOf reads a process's resident size now and at its peak (VmRSS and
// VmHWM of /proc/PID/status), in bytes.
func memoryOf(t *testing.T, p *proc) (rss, hwm uint64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", k, v, err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	if rss == 0 || hwm == 0 {
		t.Fatalf("no VmRSS or VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	}
	return rss, hwm
}

// describeRedelivered says how many messages a consumer delivered again.
func describeRedelivered(ci *jetstream.ConsumerInfo, err error) string {
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%d messages redelivered", ci.NumRedelivered)
}

// deadLetter is what the dead letters of one job id hold: how many there
// are, and of the last its body's length and toposched-dead-size header.
type deadLetter struct {
	count, kept int
	size        string
}

// deadLetters reads the dead letters by the ce-subject they carry.
func deadLetters(t *testing.T, js jetstream.JetStream) map[string]deadLetter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, streamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]deadLetter{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		id := m.Header.Get("ce-subject")
		out[id] = deadLetter{count: out[id].count + 1, kept: len(m.Data), size: m.Header.Get("toposched-dead-size")}
	}
	return out
}
