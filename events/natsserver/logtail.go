package natsserver

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// logTailLines is how many of the server's last warnings and errors Start
// quotes when the server does not become ready.
const logTailLines = 8

// logTail adapts nats-server's logger to slog and remembers the last
// warnings and errors, so that a server that cannot start says why in the
// error Start returns, not only in its log.
type logTail struct {
	l *slog.Logger

	mu      sync.Mutex
	last    []string // at most n, oldest first
	n       int
	isFatal bool
}

func newLogTail(l *slog.Logger, n int) *logTail { return &logTail{l: l, n: n} }

func (t *logTail) keep(line string, fatal bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.last) == t.n {
		t.last = t.last[1:]
	}
	t.last = append(t.last, line)
	t.isFatal = t.isFatal || fatal
}

// lines are the remembered lines, joined with "; ".
func (t *logTail) lines() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.last, "; ")
}

// fatal reports whether the server has logged a fatal error: in an
// embedded server that does not exit the process, it just stops starting.
func (t *logTail) fatal() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.isFatal
}

func (t *logTail) Noticef(format string, v ...any) { t.l.Info(fmt.Sprintf(format, v...)) }
func (t *logTail) Debugf(format string, v ...any)  { t.l.Debug(fmt.Sprintf(format, v...)) }
func (t *logTail) Tracef(format string, v ...any)  { t.l.Debug(fmt.Sprintf(format, v...)) }

func (t *logTail) Warnf(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	t.keep(line, false)
	t.l.Warn(line)
}

func (t *logTail) Errorf(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	t.keep(line, false)
	t.l.Error(line)
}

func (t *logTail) Fatalf(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	t.keep(line, true)
	t.l.Error(line)
}
