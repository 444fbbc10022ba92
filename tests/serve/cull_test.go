package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// kernelModel is the server's GET /api/kernels/<id>.
type kernelModel struct {
	ID             string `json:"id"`
	LastActivity   string `json:"last_activity"`
	ExecutionState string `json:"execution_state"`
}

// getKernel returns the server's model of a kernel, or false once the
// server no longer has it (404).
func getKernel(t *testing.T, srv *testenv.Server, id string) (kernelModel, bool) {
	t.Helper()
	// One request: the culler may end the kernel between two.
	resp, err := srv.Do(http.MethodGet, "api/kernels/"+id, nil)
	if err != nil {
		t.Fatalf("GET api/kernels/%s: %v", id, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		t.Fatalf("GET api/kernels/%s: %v", id, err)
	case resp.StatusCode == http.StatusNotFound:
		return kernelModel{}, false
	case resp.StatusCode != http.StatusOK:
		t.Fatalf("GET api/kernels/%s: %s: %s", id, resp.Status, body)
	}
	var m kernelModel
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("GET api/kernels/%s: %v in %s", id, err, body)
	}
	return m, true
}

func parseActivity(t *testing.T, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("last_activity %q: %v", s, err)
	}
	return at
}

// TestServeKeepsIdleCulling: Jupyter's idle culler still ends an idle
// kernel on time while gpumem serve is attached to it. The daemon's one
// inject may count as activity (it is an execute_request); its heartbeats
// and its attach must not, and the server must see the kernel idle (what
// JupyterLab's indicator shows) all the while.
func TestServeKeepsIdleCulling(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	const idle, interval = 8 * time.Second, time.Second
	srv := testenv.StartServerWith(t, testenv.NotebookServer(), testenv.ServerOptions{Args: []string{
		"--MappingKernelManager.cull_idle_timeout=" + strconv.Itoa(int(idle.Seconds())),
		"--MappingKernelManager.cull_interval=" + strconv.Itoa(int(interval.Seconds())),
	}})
	sess := srv.CreateSession(t, "idle.ipynb")
	id := sess.Kernel.ID
	// A first cell, as a user's: the kernel is then up, and the server has
	// seen it busy and idle.
	testenv.WaitKernelListening(t, srv.ConnectionFile(id), 60*time.Second)
	testenv.RunCell(t, srv.ConnectionFile(id), "pass", 60*time.Second)
	var before kernelModel
	testenv.Poll(t, 60*time.Second, "the new kernel to be idle", func() bool {
		m, ok := getKernel(t, srv, id)
		if !ok {
			t.Fatalf("kernel %s culled before the daemon started", id)
		}
		before = m
		return m.ExecutionState == "idle"
	})

	d := startDaemon(t, srv, testenv.NewFakeGPU(t))
	testenv.Poll(t, 30*time.Second, "the daemon to inject the magics", func() bool {
		_, ok := d.FindLog("magics injected", map[string]any{"kernel_id": id})
		return ok
	})
	// The inject's idle status reaches the server right after its reply.
	var after kernelModel
	testenv.Poll(t, 10*time.Second, "the server to see the kernel idle after the inject", func() bool {
		m, ok := getKernel(t, srv, id)
		if !ok {
			t.Fatalf("kernel %s culled right after the inject", id)
		}
		after = m
		return m.ExecutionState == "idle"
	})
	injectCounts := after.LastActivity != before.LastActivity
	t.Logf("the inject counts as activity: %v (last_activity %s -> %s)", injectCounts, before.LastActivity, after.LastActivity)

	// From now on nothing may touch the kernel's activity: the daemon only
	// listens on iopub. Poll until the culler ends it.
	last := parseActivity(t, after.LastActivity)
	samples := 0
	var culled time.Time
	testenv.Poll(t, idle+interval+30*time.Second, "the culler to end the idle kernel", func() bool {
		m, ok := getKernel(t, srv, id)
		if !ok {
			culled = time.Now()
			return true
		}
		samples++
		if m.LastActivity != after.LastActivity {
			t.Fatalf("last_activity moved from %s to %s while only gpumem serve was attached", after.LastActivity, m.LastActivity)
		}
		if m.ExecutionState != "idle" {
			t.Fatalf("the server sees the kernel %q while nothing runs in it", m.ExecutionState)
		}
		return false
	})
	if _, ok := d.FindLog("magics injected", map[string]any{"kernel_id": id}); !ok || d.Exited() {
		t.Fatalf("the daemon was not attached all along\n%s", d.Output())
	}
	waited := culled.Sub(last)
	t.Logf("culled %v after the last activity (cull_idle_timeout %v, cull_interval %v; %d samples, all idle)", waited.Round(10*time.Millisecond), idle, interval, samples)
	// The server culls at its first check past the timeout; a server busy on
	// a loaded machine may check a little late.
	if waited < idle-interval || waited > idle+2*interval+5*time.Second {
		t.Errorf("culled %v after the last activity, want about %v (+ up to %v)", waited, idle, interval)
	}
}

// TestServeBusyOnlyWhileFreeing: what JupyterLab's kernel indicator shows
// (the server's execution_state, fed by the kernel's IOPub status) is busy
// only while gpumem's request runs: a `gpumem free` through the daemon
// leaves the kernel idle as soon as it returns, and nothing else makes it
// busy while the daemon stays attached.
func TestServeBusyOnlyWhileFreeing(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	d := startDaemon(t, srv, gpu)
	nb := openNotebook(t, srv, "busy.ipynb")
	nb.waitMagic(t, 30*time.Second)
	id := nb.sess.Kernel.ID

	type sample struct {
		at    time.Time
		state string
	}
	var samples []sample
	record := func() {
		m, ok := getKernel(t, srv, id)
		if !ok {
			t.Fatalf("kernel %s gone", id)
		}
		samples = append(samples, sample{time.Now(), m.ExecutionState})
	}
	testenv.Poll(t, 10*time.Second, "the kernel to be idle", func() bool {
		m, _ := getKernel(t, srv, id)
		return m.ExecutionState == "idle"
	})
	// The free runs in a goroutine; the test samples the server meanwhile.
	done := make(chan error, 1)
	var freeStart, freeEnd time.Time
	freeStart = time.Now()
	go func() {
		cmd := exec.Command(gpumemBin, "free", id)
		cmd.Env = testenv.Env(srv.Dir, "GPUMEM_FAKE_GPU="+gpu.Path)
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		done <- err
	}()
	// One sample every 10 ms: often enough to see a busy of a few tens
	// of ms, rarely enough not to load the server.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for freeEnd.IsZero() {
		select {
		case err := <-done:
			freeEnd = time.Now()
			if err != nil {
				t.Fatalf("gpumem free: %v", err)
			}
		case <-tick.C:
			record()
		}
	}
	// After the free, idle at once and for the next second.
	settle := time.Now().Add(time.Second)
	for time.Now().Before(settle) {
		<-tick.C
		record()
	}
	busy := 0
	for _, s := range samples {
		if s.state == "busy" {
			busy++
			// The server learns of idle a moment after the reply: allow 500 ms.
			if s.at.After(freeEnd.Add(500 * time.Millisecond)) {
				t.Errorf("busy %v after the free returned", s.at.Sub(freeEnd))
			}
		}
	}
	if last := samples[len(samples)-1]; last.state != "idle" {
		t.Errorf("state %q a second after the free", last.state)
	}
	t.Logf("gpumem free took %v; %d of %d samples busy, all during it", freeEnd.Sub(freeStart).Round(time.Millisecond), busy, len(samples))
	if d.Exited() {
		t.Fatalf("daemon exited\n%s", d.Output())
	}
}
