package adversarial

import (
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// maxDaemonRSS is the most the daemon may hold whatever a user sends it.
const maxDaemonRSS = 256 << 20

// rssWatch reads the daemon's memory every 10 ms and, as soon as it
// passes maxDaemonRSS, kills the daemon through its os.Process (a pidfd):
// an old build may grow by gigabytes, and must not take the machine.
type rssWatch struct {
	mu     sync.Mutex
	peak   uint64
	killed bool
	stop   chan struct{}
	done   chan struct{}
}

func watchRSS(t *testing.T, d *testenv.Daemon) *rssWatch {
	w := &rssWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			rss, hwm, err := testenv.ProcMemory(d.PID())
			if err == nil {
				w.mu.Lock()
				w.peak = max(w.peak, rss, hwm)
				over := w.peak > maxDaemonRSS && !w.killed
				w.killed = w.killed || over
				w.mu.Unlock()
				if over {
					_ = d.Cmd.Process.Kill()
				}
			}
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(w.stop); <-w.done })
	return w
}

// check fails the test if the daemon's memory passed maxDaemonRSS; the
// peak is the highest of the polled VmRSS and VmHWM.
func (w *rssWatch) check(t *testing.T, d *testenv.Daemon, what string) uint64 {
	t.Helper()
	peak, killed := w.peakNow(), w.killedNow()
	if _, hwm, err := testenv.ProcMemory(d.PID()); err == nil {
		peak = max(peak, hwm)
	}
	t.Logf("%s: the daemon's peak RSS %.1f MiB", what, float64(peak)/(1<<20))
	if killed || peak > maxDaemonRSS {
		t.Fatalf("%s: the daemon's RSS reached %.1f MiB (over %d MiB; killed: %v)", what, float64(peak)/(1<<20), maxDaemonRSS>>20, killed)
	}
	return peak
}

func (w *rssWatch) peakNow() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak
}

func (w *rssWatch) killedNow() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.killed
}
