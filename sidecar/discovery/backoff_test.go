package discovery

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestServerBackoffDelays(t *testing.T) {
	now := time.Unix(1000, 0)
	b := &ServerBackoff{now: func() time.Time { return now }}
	if !b.allow("f") {
		t.Fatal("a server never asked is held back")
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second} {
		b.done("f", true)
		if b.allow("f") {
			t.Fatalf("failure %d: asked again at once", i+1)
		}
		now = now.Add(want - time.Millisecond)
		if b.allow("f") {
			t.Fatalf("failure %d: asked again before %v", i+1, want)
		}
		now = now.Add(time.Millisecond)
		if !b.allow("f") {
			t.Fatalf("failure %d: not asked again after %v", i+1, want)
		}
	}
	for range 20 {
		b.done("f", true)
	}
	now = now.Add(serverBackoffMax)
	if !b.allow("f") {
		t.Errorf("held back past the cap of %v", serverBackoffMax)
	}
	b.done("f", false)
	b.done("f", true)
	now = now.Add(time.Second)
	if !b.allow("f") {
		t.Error("a success did not forget the failures before it")
	}
	b.keep(map[string]bool{})
	if len(b.tries) != 0 {
		t.Errorf("a gone server is remembered: %v", b.tries)
	}
	var nilB *ServerBackoff
	nilB.done("f", true)
	if !nilB.allow("f") {
		t.Error("no backoff holds a server back")
	}
}

// A server that trickles its answer is cut at ServerTimeout, reported,
// and not asked at the next scans while its delay runs; the others are
// asked every time.
func TestDiscoverSlowServerBackedOff(t *testing.T) {
	var slowHits, fastHits atomic.Int32
	stop := make(chan struct{})
	var handlers sync.WaitGroup
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers.Add(1)
		defer handlers.Done()
		slowHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("["))
		w.(http.Flusher).Flush()
		select { // never finishes: only the deadline ends it
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fastHits.Add(1)
		_, _ = w.Write([]byte("[]"))
	}))
	t.Cleanup(func() { close(stop); slow.Close(); fast.Close(); handlers.Wait() })
	dir := t.TempDir()
	for i, u := range []string{slow.URL, fast.URL} {
		doc := fmt.Sprintf(`{"url":%q,"token":"t","pid":%d}`, u+"/", i+1)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("jpserver-%d.json", i+1)), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The backoff's clock stands still until the test moves it: the scans
	// in between are in the delay however slow a loaded machine runs them.
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	b := &ServerBackoff{now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }}
	timeout := 2 * time.Second
	opts := Options{RuntimeDirs: []string{dir}, ServerTimeout: timeout, Backoff: b}
	start := time.Now()
	res := Discover(context.Background(), opts)
	// Without the deadline the scan would wait for the slow server forever.
	if took := time.Since(start); took > 10*timeout {
		t.Errorf("the first scan took %v: the slow server was not cut at its deadline (%v)", took, timeout)
	}
	if len(res.Problems) != 1 || !strings.Contains(res.Problems[0].Error(), slow.URL) {
		t.Errorf("problems %v, want one naming the slow server", res.Problems)
	}
	for range 3 {
		res = Discover(context.Background(), opts)
		if len(res.Problems) != 0 {
			t.Errorf("problems during the backoff: %v", res.Problems)
		}
	}
	if slowHits.Load() != 1 || fastHits.Load() != 4 {
		t.Errorf("slow server asked %d times, fast %d, want 1 and 4", slowHits.Load(), fastHits.Load())
	}
	// Its delay over, the slow server is asked again.
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	Discover(context.Background(), opts)
	if slowHits.Load() != 2 || fastHits.Load() != 5 {
		t.Errorf("after the delay: slow server asked %d times, fast %d, want 2 and 5", slowHits.Load(), fastHits.Load())
	}
}
