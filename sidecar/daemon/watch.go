package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// dirWatcher signals when the set of kernels or servers in the runtime dirs
// may have changed: on inotify events for kernel-*.json and *server-*.json,
// and at every rescan tick as a safety net (inotify can overflow, and a dir
// that does not exist yet cannot be watched).
type dirWatcher struct {
	dirs    []string
	rescan  time.Duration
	trigger chan struct{} // capacity 1: signals coalesce
}

func newDirWatcher(dirs []string, rescan time.Duration) *dirWatcher {
	return &dirWatcher{dirs: dirs, rescan: rescan, trigger: make(chan struct{}, 1)}
}

// C is signalled (coalesced) whenever a scan is due.
func (w *dirWatcher) C() <-chan struct{} { return w.trigger }

func (w *dirWatcher) signal() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// relevant reports whether a file name in a runtime dir matters to us.
func relevant(name string) bool {
	base := filepath.Base(name)
	if !strings.HasSuffix(base, ".json") {
		return false
	}
	return strings.HasPrefix(base, "kernel-") || strings.HasPrefix(base, "jpserver-") || strings.HasPrefix(base, "nbserver-")
}

// Run watches until ctx ends. It returns only after its goroutines have.
func (w *dirWatcher) Run(ctx context.Context) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		// No inotify (limits reached, odd filesystem): periodic rescans alone.
		fw = nil
	}
	watched := map[string]bool{}
	addWatches := func() {
		if fw == nil {
			return
		}
		for _, d := range w.dirs {
			if watched[d] {
				continue
			}
			if err := fw.Add(d); err == nil {
				watched[d] = true
				w.signal() // files may have appeared before the watch
			}
		}
	}
	addWatches()
	w.signal()
	ticker := time.NewTicker(w.rescan)
	defer ticker.Stop()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if fw != nil {
		defer fw.Close()
		events, errs = fw.Events, fw.Errors
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			addWatches()
			w.signal()
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if ev.Op&(fsnotify.Remove|fsnotify.Rename) != 0 && watchedDir(watched, ev.Name) {
				delete(watched, ev.Name) // the dir itself went; re-added on a tick
			}
			if relevant(ev.Name) {
				w.signal()
			}
		case _, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			w.signal() // overflow or similar: rescan
		}
	}
}

func watchedDir(watched map[string]bool, name string) bool { return watched[filepath.Clean(name)] }
