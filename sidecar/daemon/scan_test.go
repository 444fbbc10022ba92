package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs/procstest"
)

// Connection files that no process of their owner serves or names are
// anyone's to write: none is followed (no goroutine dials it), however
// many, and one that a process later serves is followed from the next
// scan.
func TestJunkFilesNotFollowed(t *testing.T) {
	r := newRig(t, Config{})
	before := runtime.NumGoroutine()
	for i := range 500 {
		r.kernelFile(fmt.Sprintf("junk%03d", i), discovery.Owner{})
	}
	r.d.scan(r.ctx)
	r.d.scan(r.ctx)
	r.d.mu.Lock()
	n := len(r.d.kernels)
	r.d.mu.Unlock()
	if n != 0 {
		t.Errorf("%d junk files followed", n)
	}
	if after := runtime.NumGoroutine(); after > before+5 {
		t.Errorf("goroutines %d -> %d for 500 junk files", before, after)
	}
	r.setProcs(procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100})
	real := r.kernelFile("junk007", discovery.Owner{PID: 100, Start: 100, FromPort: true, UIDMatch: true, Proven: true})
	r.d.scan(r.ctx)
	if ks := r.kernel(real); ks == nil || ks.cur.PID != 100 {
		t.Errorf("a file proven later is not followed: %+v", ks)
	}
}

// Another user's kernels are followed up to maxFollowedPerUser; the
// daemon's own user's are not capped.
func TestFollowedCapPerUser(t *testing.T) {
	testenv.RequireRoot(t, "files of another uid: chown needs root")
	r := newRig(t, Config{})
	const other = 4242
	r.setProcs(procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100})
	for i := range maxFollowedPerUser + 10 {
		f := r.kernelFile(fmt.Sprintf("theirs%03d", i), discovery.Owner{PID: 100, Start: 100, Flagged: true, UIDMatch: true})
		if err := os.Chown(f, other, other); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		r.kernelFile(fmt.Sprintf("ours%03d", i), discovery.Owner{PID: 100, Start: 100, Flagged: true, UIDMatch: true})
	}
	r.d.scan(r.ctx)
	r.d.mu.Lock()
	n := r.d.followedPerUserLocked()
	r.d.mu.Unlock()
	if n[other] != maxFollowedPerUser || n[r.d.selfUID] != 10 {
		t.Errorf("followed %d of uid %d and %d of ours, want %d and 10", n[other], other, n[r.d.selfUID], maxFollowedPerUser)
	}
	r.waitLog(fmt.Sprintf("uid %d has %d kernels followed, the most for one user", other, maxFollowedPerUser))
}

// A kernel whose process a scan proves after a sample read /proc is not
// judged by that older table (where its process may be missing): it is
// not retired, and the next sample sees it.
func TestSampleSkipsKernelsProvenAfterItsRead(t *testing.T) {
	r := newRig(t, Config{Reclaim: true})
	r.setProcs(procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100})
	k := r.kernelFile("k1", discovery.Owner{PID: 100, Start: 100, Flagged: true, UIDMatch: true})
	r.d.scan(r.ctx) // followed, its process not proven yet
	var once sync.Once
	r.d.sampling.afterObserve = func() {
		once.Do(func() {
			// Between the read and the judgement: the process starts and
			// a scan proves it.
			r.setProcs(procstest.Proc{PID: 300, PPID: 1, PGID: 300, SID: 300})
			r.mu.Lock()
			r.owners[k] = discovery.Owner{PID: 300, Start: 300, FromPort: true, UIDMatch: true, Proven: true}
			r.mu.Unlock()
			r.d.scan(r.ctx)
		})
	}
	r.d.sample(r.ctx)
	if ks := r.kernel(k); ks == nil || ks.cur.PID != 300 {
		t.Fatalf("the kernel proven during the sample was retired: %+v", ks)
	}
	r.d.sample(r.ctx)
	if ks := r.kernel(k); ks.cur.PID != 300 {
		t.Errorf("the next sample lost it: %+v", ks)
	}
}

// Sampling does not wait for discovery: while every scan waits on a
// server that never answers, the samples go on every interval.
func TestSamplingDoesNotWaitForDiscovery(t *testing.T) {
	r := newRig(t, Config{Interval: 50 * time.Millisecond, Rescan: 50 * time.Millisecond})
	stop := make(chan struct{})
	var handlers sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		select { // never answers: only its deadline ends the request
		case <-req.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(func() { close(stop); srv.Close(); handlers.Wait() })
	doc := fmt.Sprintf(`{"url":%q,"token":"t","pid":1}`, srv.URL+"/")
	if err := os.WriteFile(filepath.Join(r.dir, "jpserver-1.json"), []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	done := runDaemon(t, r)
	sampledAt := func() time.Time {
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		return r.d.pub.last.SampledAt
	}
	r.waitLog("does not answer") // a scan waited its deadline
	// Over 3 s (more than one server deadline), no sample waits a second.
	last, worst := sampledAt(), time.Duration(0)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if at := sampledAt(); !at.Equal(last) {
			last = at
		}
		worst = max(worst, time.Since(last))
		time.Sleep(10 * time.Millisecond)
	}
	if worst > time.Second {
		t.Errorf("a sample waited %v behind discovery, at a 50 ms interval", worst)
	}
	done()
}

// runDaemon runs r's daemon until the returned stop is called; stop waits
// for Run to return and fails the test on its error.
func runDaemon(t *testing.T, r *rig) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() { done <- r.d.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Run did not return")
		}
	}
}

// Run stops cleanly while scans run and follow kernels: discovery is
// waited for before the kernels' goroutines and the socket's (a scan
// still running may add to either).
func TestRunStopsWhileScanning(t *testing.T) {
	for i := range 10 {
		r := newRig(t, Config{Interval: 5 * time.Millisecond, Rescan: time.Millisecond})
		r.setProcs(procstest.Proc{PID: 100, PPID: 1, PGID: 100, SID: 100})
		stop := runDaemon(t, r)
		for j := range 20 {
			r.kernelFile(fmt.Sprintf("k%d-%d", i, j), discovery.Owner{PID: 100, Start: 100, Flagged: true, UIDMatch: true})
		}
		stop()
	}
}
