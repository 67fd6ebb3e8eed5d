package policies

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// DefaultWatchInterval is how often Watch reads its directory.
const DefaultWatchInterval = 2 * time.Second

// Watch compiles the set in dir, hands it to onSet, then reads dir every
// DefaultWatchInterval and, whenever its files changed, compiles and tests
// the new set before handing it over. A set that fails (a *RefusedError
// holding its revision and the Errors naming file and line) goes to onError
// and the previous set stays in force; the
// same broken contents are not retried until they change again. It returns
// when ctx ends.
func Watch(ctx context.Context, dir string, onSet func(*Set), onError func(error)) {
	WatchEvery(ctx, dir, DefaultWatchInterval, onSet, onError)
}

// WatchEvery is Watch reading dir every interval.
//
// It polls rather than use inotify: a policy directory is a handful of
// small files, hashing them is cheap, and polling sees edits made through
// bind mounts and ConfigMap symlink swaps that inotify misses.
//
// After the first read, a change is taken only once two successive reads
// agree on it: an editor writing a file in place can be caught between
// truncating and writing, and that half-written file is not a set anyone
// meant to be refused.
func WatchEvery(ctx context.Context, dir string, interval time.Duration, onSet func(*Set), onError func(error)) {
	fsys := os.DirFS(dir)
	var last string    // revision of the last contents tried
	var pending string // revision of changed contents read once
	first := true
	try := func() {
		src, err := readSet(fsys)
		if err != nil {
			onError(err)
			return
		}
		if src.revision == last {
			pending = ""
			return
		}
		if !first && src.revision != pending {
			pending = src.revision
			return
		}
		first, pending, last = false, "", src.revision
		s, _, err := compileSources(ctx, src, dir)
		if err != nil {
			if ctx.Err() == nil {
				onError(refused(dir, src.revision, err))
			}
			return
		}
		onSet(s)
	}
	try()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			try()
		}
	}
}

// RefusedError is a set a watcher refused: which contents, and why. It
// unwraps to the Errors.
type RefusedError struct {
	// Name is the set's name (its directory).
	Name string
	// Revision is the revision of the refused contents.
	Revision string
	// Errs are the reasons, naming file and line.
	Errs Errors
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("policy set %s@%s refused: %v", e.Name, short(e.Revision), e.Errs)
}

func (e *RefusedError) Unwrap() error { return e.Errs }

// refused wraps a compile error of the contents at rev.
func refused(name, rev string, err error) error {
	var errs Errors
	if !errors.As(err, &errs) {
		errs = Errors{{Msg: err.Error(), Code: "rego_error"}}
	}
	return &RefusedError{Name: name, Revision: rev, Errs: errs}
}
