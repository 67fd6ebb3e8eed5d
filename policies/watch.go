package policies

import (
	"context"
	"os"
	"time"
)

// DefaultWatchInterval is how often Watch reads its directory.
const DefaultWatchInterval = 2 * time.Second

// Watch compiles the set in dir, hands it to onSet, then reads dir every
// DefaultWatchInterval and, whenever its files changed, compiles and tests
// the new set before handing it over. A set that fails (an Errors naming
// file and line) goes to onError and the previous set stays in force; the
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
func WatchEvery(ctx context.Context, dir string, interval time.Duration, onSet func(*Set), onError func(error)) {
	fsys := os.DirFS(dir)
	var last string // revision of the last contents tried
	try := func() {
		src, err := readSet(fsys)
		if err != nil {
			onError(err)
			return
		}
		if src.revision == last {
			return
		}
		last = src.revision
		s, _, err := compileSources(ctx, src, dir)
		if err != nil {
			if ctx.Err() == nil {
				onError(err)
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
