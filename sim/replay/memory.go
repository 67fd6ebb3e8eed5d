package replay

// Memory measurements of a replay: the peak heap sampled while it runs,
// and the process's peak resident set.

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
)

// memSampler keeps the largest heap in use seen while a replay runs.
type memSampler struct {
	mu   sync.Mutex
	max  uint64
	done chan struct{}
	wg   sync.WaitGroup
}

func (m *memSampler) start() {
	m.done = make(chan struct{})
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			m.read()
			select {
			case <-t.C:
			case <-m.done:
				return
			}
		}
	}()
}

func (m *memSampler) read() {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.mu.Lock()
	m.max = max(m.max, ms.HeapInuse)
	m.mu.Unlock()
}

func (m *memSampler) stop() {
	close(m.done)
	m.wg.Wait()
	m.read()
}

func (m *memSampler) peak() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.max
}

// peakRSS is the process's peak resident set (Linux VmHWM), 0 elsewhere.
func peakRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for l := range strings.Lines(string(data)) {
		var kb uint64
		if _, err := fmt.Sscanf(l, "VmHWM: %d kB", &kb); err == nil {
			return kb << 10
		}
	}
	return 0
}
