package bus

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

func TestWarmStacksReturnWhatTheHandlerReturns(t *testing.T) {
	w := newWarmStacks()
	defer w.stop()
	want := errors.New("boom")
	h := w.middleware(func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage("out-"+msg.UUID, nil)}, want
	})
	out, err := h(message.NewMessage("1", nil))
	if !errors.Is(err, want) || len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("got %v, %v; want out-1, %v", out, err, want)
	}
}

func TestWarmStacksRaiseAPanicOnTheCaller(t *testing.T) {
	w := newWarmStacks()
	defer w.stop()
	h := w.middleware(func(*message.Message) ([]*message.Message, error) { panic("handler broke") })
	defer func() {
		r := recover()
		s, _ := r.(string)
		if !strings.Contains(s, "handler broke") || !strings.Contains(s, "stacks_test.go") {
			t.Fatalf("recovered %v; want the panic with the handler's stack", r)
		}
	}()
	_, _ = h(message.NewMessage("1", nil))
	t.Fatal("no panic")
}

// Messages one after another reuse one goroutine; at once, each gets its
// own, and at most keptWorkers stay idle after.
func TestWarmStacksKeepGoroutines(t *testing.T) {
	w := newWarmStacks()
	var ids sync.Map
	var count int
	var mu sync.Mutex
	h := w.middleware(func(*message.Message) ([]*message.Message, error) {
		mu.Lock()
		count++
		mu.Unlock()
		ids.Store(goroutineMarker(), true)
		return nil, nil
	})
	for range 10 {
		if _, err := h(message.NewMessage("1", nil)); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	ids.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("10 messages in turn ran on %d goroutines; want 1", n)
	}

	release := make(chan struct{})
	var started, wg sync.WaitGroup
	block := w.middleware(func(*message.Message) ([]*message.Message, error) {
		started.Done()
		<-release
		return nil, nil
	})
	const atOnce = 2 * keptWorkers
	started.Add(atOnce)
	for range atOnce {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = block(message.NewMessage("2", nil))
		}()
	}
	started.Wait() // every one running at once: none waited for another
	close(release)
	wg.Wait()
	if idle := w.idle.Load(); idle > keptWorkers {
		t.Fatalf("%d idle goroutines kept; want at most %d", idle, keptWorkers)
	}
	w.stop()
	w.stop() // twice is harmless
	// After stop a message still runs, on a goroutine of its own.
	if _, err := h(message.NewMessage("3", nil)); err != nil || count != 11 {
		t.Fatalf("after stop: %v, %d handled; want nil, 11", err, count)
	}
}

// goroutineMarker is the calling goroutine's id, read from the first line
// of its stack trace ("goroutine 123 [running]:").
func goroutineMarker() string {
	buf := make([]byte, 64)
	f := strings.Fields(string(buf[:runtime.Stack(buf, false)]))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}
