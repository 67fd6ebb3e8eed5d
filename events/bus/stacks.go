package bus

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// keptWorkers is how many idle handler goroutines a router keeps. A
// service's handlers run a few messages at once (Handler.Concurrency), so
// a few dozen cover every router; a burst above that starts goroutines
// that end when their message is done.
const keptWorkers = 32

// warmStacks runs each message's handling on a goroutine kept from earlier
// messages. Watermill starts a goroutine per message, and a handler is deep
// (OPA's evaluator, the schema validator, the placer): a new goroutine's
// stack starts at the runtime's average and is copied at every doubling on
// the way to the tens of KB a handler needs. That copying was 5% of the
// CPU of the Alibaba openb replay; a kept goroutine has grown its stack
// already. The Watermill goroutine waits on a channel meanwhile, shallow.
type warmStacks struct {
	work chan func()
	done chan struct{}
	idle atomic.Int32
}

func newWarmStacks() *warmStacks {
	return &warmStacks{work: make(chan func()), done: make(chan struct{})}
}

// run calls f on an idle kept goroutine, or on a new one when none is idle.
func (w *warmStacks) run(f func()) {
	select {
	case w.work <- f:
	default:
		go w.loop(f)
	}
}

func (w *warmStacks) loop(f func()) {
	for {
		f()
		if w.idle.Add(1) > keptWorkers {
			w.idle.Add(-1)
			return
		}
		select {
		case f = <-w.work:
			w.idle.Add(-1)
		case <-w.done:
			w.idle.Add(-1)
			return
		}
	}
}

// stop ends the idle goroutines; one still handling a message ends when it
// is done. A message handled after stop runs on a goroutine of its own.
func (w *warmStacks) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
}

// middleware is the outermost middleware: the whole stack below runs on a
// kept goroutine, and a panic that escapes it is raised again on the
// Watermill goroutine, whose recovery nacks the message as before.
func (w *warmStacks) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var (
			out   []*message.Message
			err   error
			fault any
		)
		finished := make(chan struct{})
		w.run(func() {
			defer close(finished)
			defer func() {
				if r := recover(); r != nil {
					fault = fmt.Sprintf("%v\n%s", r, debug.Stack())
				}
			}()
			out, err = h(msg)
		})
		<-finished
		if fault != nil {
			panic(fault)
		}
		return out, err
	}
}
