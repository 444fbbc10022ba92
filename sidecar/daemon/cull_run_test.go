package daemon

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// fakeServer answers /api/sessions as a Jupyter server would, for one
// kernel, and records DELETE /api/kernels/{id}.
type fakeServer struct {
	*httptest.Server
	mu       sync.Mutex
	state    string
	last     time.Time
	deleted  []string
	sessions int
}

func newFakeServer(t *testing.T, kernelID string) *fakeServer {
	f := &fakeServer{state: "idle"}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r.Header.Get("Authorization") != "token t" {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/api/sessions":
			f.sessions++
			_ = json.NewEncoder(w).Encode([]map[string]any{{"id": "s", "path": "a.ipynb", "type": "notebook",
				"kernel": map[string]any{"id": kernelID, "execution_state": f.state, "last_activity": f.last.Format(time.RFC3339Nano)}}})
		case r.Method == http.MethodDelete && r.URL.Path == "/api/kernels/"+kernelID:
			f.deleted = append(f.deleted, kernelID)
			w.WriteHeader(http.StatusNoContent)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) deletes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.deleted)
}

// The runner: an idle kernel holding memory is warned (alert and activity
// in the report), then shut down through its server once the warning has
// run out; one used since is not; a busy one is not warned.
func TestCullRunner(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Cull: CullConfig{Idle: time.Minute, MinMemory: 1 << 30, Action: CullShutdown, Warn: 0}})
	// Culling waits for the readings that judge the tree's GPU work.
	r.d.sample(r.ctx)
	r.d.sample(r.ctx)
	srv := newFakeServer(t, "k1")
	idleSince := time.Now().Add(-time.Hour)
	srv.last = idleSince
	setServer := func(state string, last time.Time) {
		r.d.mu.Lock()
		ks := r.d.kernels[k1]
		ks.server, ks.execState, ks.lastActivity = discovery.Server{URL: srv.URL + "/", Token: "t", FileUID: uint32(os.Geteuid())}, state, last
		r.d.mu.Unlock()
	}
	report := func() []attribution.Alert {
		r.d.mu.Lock()
		rep := r.d.pub.last.Report
		r.d.mu.Unlock()
		culls, activity := r.d.cull(r.ctx, rep, nil)
		attribution.Finish(&rep, attribution.FinishInput{Now: time.Now(), Kernels: activity, Culls: culls})
		alerts := rep.Alerts
		for _, nb := range rep.Notebooks {
			if nb.KernelID == "k1" && nb.Activity == nil {
				t.Errorf("no activity for k1 in the report")
			}
		}
		return alerts
	}

	// Busy: nothing.
	setServer("busy", idleSince)
	if a := report(); len(a) != 0 {
		t.Fatalf("a busy kernel was warned: %+v", a)
	}
	// Idle: warned.
	setServer("idle", idleSince)
	a := report()
	if len(a) != 1 || a[0].Kernels[0] != "k1" || a[0].GPU != -1 {
		t.Fatalf("warning %+v", a)
	}
	r.waitLog("idle kernel holds GPU memory: warned", `"kernel_id":"k1"`)
	// Used since the warning: cancelled.
	setServer("idle", time.Now())
	report()
	r.waitLog("cull cancelled", "used since the warning")
	// Idle again, warned again, and (no warning period) acted on.
	setServer("idle", idleSince)
	report()
	report()
	testenv.Poll(t, 15*time.Second, "DELETE /api/kernels/k1", func() bool { return srv.deletes() == 1 })
	r.waitLog("idle kernel holding GPU memory shut down through its server")
	// Already culled, not used since: nothing more.
	report()
	if n := srv.deletes(); n != 1 {
		t.Errorf("%d deletes, want 1", n)
	}
}

// "Keep it": the kernel's user keeps it; the warning is withdrawn with
// that reason, and the keep counts as use (the kernel is idle from the
// keep, so no new warning follows at once). Another kernel of the same id
// is not the one kept, and a daemon that culls nothing refuses.
func TestCullKeep(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Cull: CullConfig{Idle: time.Minute, MinMemory: 1 << 30, Action: CullShutdown, Warn: time.Hour}})
	r.d.sample(r.ctx)
	r.d.sample(r.ctx)
	srv := newFakeServer(t, "k1")
	r.d.mu.Lock()
	ks := r.d.kernels[k1]
	ks.server, ks.execState, ks.lastActivity = discovery.Server{URL: srv.URL + "/", Token: "t", FileUID: uint32(os.Geteuid())}, "idle", time.Now().Add(-time.Hour)
	r.d.mu.Unlock()
	cull := func() []attribution.CullWarning {
		r.d.mu.Lock()
		rep := r.d.pub.last.Report
		r.d.mu.Unlock()
		w, _ := r.d.cull(r.ctx, rep, nil)
		return w
	}
	if w := cull(); len(w) != 1 {
		t.Fatalf("warnings %+v, want k1's", w)
	}
	if _, err := r.d.api().KeepKernel(r.ctx, api.KernelRef{ID: "k1", ConnectionFile: k1 + ".other"}); !errors.Is(err, api.ErrKernelNotFound) {
		t.Errorf("a keep of another file of the same id: %v, want not found", err)
	}
	reply, err := r.d.api().KeepKernel(r.ctx, api.KernelRef{ID: "k1", ConnectionFile: k1})
	if err != nil || reply.KernelID != "k1" || !strings.Contains(reply.Text, "warned again only after 1 min idle") {
		t.Fatalf("keep: %+v, %v", reply, err)
	}
	if w := cull(); len(w) != 0 {
		t.Errorf("the warning stands after the keep: %+v", w)
	}
	r.waitLog("cull cancelled", "kept by its user")
	if w := cull(); len(w) != 0 {
		t.Errorf("warned again right after the keep (it counts as use): %+v", w)
	}
	if srv.deletes() != 0 {
		t.Errorf("a kept kernel was shut down")
	}
	off, _, _ := twoKernels(t, Config{})
	if _, err := off.d.api().KeepKernel(off.ctx, api.KernelRef{ID: "k1", ConnectionFile: k1}); !errors.Is(err, api.ErrRefused) {
		t.Errorf("keep with culling off: %v, want refused", err)
	}
}

// A kernel with no server that reports it is never culled, and the log
// says so once.
func TestCullWithoutServer(t *testing.T) {
	r, _, _ := twoKernels(t, Config{Cull: CullConfig{Idle: time.Minute, MinMemory: 1 << 30, Action: CullShutdown}})
	r.d.mu.Lock()
	rep := r.d.pub.last.Report
	r.d.mu.Unlock()
	if a, _ := r.d.cull(r.ctx, rep, nil); len(a) != 0 {
		t.Fatalf("warned without a server: %+v", a)
	}
	r.waitLog("no Jupyter server reports its activity: never culled")
}

// The last look before a cull acts: a kernel whose tree computed on a GPU
// since the decision is left alone, whatever its server says (the server
// still reports it idle and unused).
func TestCullKernelCancelledWhenItsTreeComputedSince(t *testing.T) {
	r, k1, _ := twoKernels(t, Config{Cull: CullConfig{Idle: time.Minute, MinMemory: 1 << 30, Action: CullShutdown}})
	srv := newFakeServer(t, "k1")
	srv.last = time.Now().Add(-time.Hour)
	server := discovery.Server{URL: srv.URL + "/", Token: "t", FileUID: uint32(os.Geteuid())}
	r.d.mu.Lock()
	ks := r.d.kernels[k1]
	ks.server, ks.execState, ks.lastActivity = server, "idle", srv.last
	ks.cull.doneAt = time.Now().Add(-time.Minute)
	before := ks.cull
	r.d.mu.Unlock()
	r.d.compute.mu.Lock()
	r.d.compute.computedAt[k1] = time.Now()
	r.d.compute.mu.Unlock()
	r.d.cullKernel(r.ctx, ks, server, 2<<30, cullAction{action: CullShutdown, since: before.doneAt}, before)
	r.waitLog("cull cancelled: its processes computed on a GPU", `"kernel_id":"k1"`)
	if n := srv.deletes(); n != 0 {
		t.Errorf("%d deletes of a kernel whose tree computed since the decision, want 0", n)
	}
}

// The GPU-idle rule beside a keep-alive: k1 runs a cell before every
// sample (its server's last_activity is always now) but its processes do
// no GPU work; k2 trains. k1 is warned in the GPU-idle rule's words, its
// caches are freed first, it is warned again and then shut down through
// its server, however recent its last cell; k2 is never touched.
func TestCullRunnerGPUIdle(t *testing.T) {
	r, k1, k2 := twoKernels(t, Config{Cull: CullConfig{GPUIdle: time.Minute, MinMemory: 1 << 30, Action: CullShutdown, Warn: 0}})
	srv := newFakeServer(t, "k1")
	server := discovery.Server{URL: srv.URL + "/", Token: "t", FileUID: uint32(os.Geteuid())}
	facts := &attribution.ComputeFacts{Kernels: map[string]attribution.Compute{
		k1: {State: attribution.ComputeIdle}, k2: {State: attribution.ComputeComputing}}}
	spellStart := time.Now().Add(-2 * time.Minute)
	var culled []attribution.Alert
	round := func() []attribution.Alert {
		t.Helper()
		r.d.mu.Lock()
		for _, file := range []string{k1, k2} { // the keep-alive's cell, a moment ago
			ks := r.d.kernels[file]
			ks.server, ks.execState, ks.lastActivity = server, "idle", time.Now()
			if ks.cull.judgedIdleFrom.IsZero() && file == k1 {
				ks.cull.judgedIdleFrom = spellStart // judged idle since two minutes
			}
		}
		srv.last = time.Now()
		rep := r.d.pub.last.Report
		r.d.mu.Unlock()
		culls, activity := r.d.cull(r.ctx, rep, facts)
		attribution.Finish(&rep, attribution.FinishInput{Now: time.Now(), Kernels: activity, Culls: culls})
		return rep.Alerts
	}
	a := round()
	if len(a) != 1 || a[0].Kernels[0] != "k1" || !strings.Contains(a[0].Message, "no GPU work for 2 min") ||
		!strings.Contains(a[0].Message, "have its GPU caches freed") {
		t.Fatalf("first GPU-idle warning: %+v", a)
	}
	round() // the warning ran out: the free first (the rig has no kernel to free in)
	r.waitLog("cull: not attached to the kernel; nothing freed", `"action":"free"`, `"gpu_idle_rule":true`)
	if n := srv.deletes(); n != 0 {
		t.Fatalf("shut down before its caches were freed: %d deletes", n)
	}
	if culled = round(); len(culled) != 1 || !strings.Contains(culled[0].Message, "be shut down") {
		t.Fatalf("second GPU-idle warning: %+v", culled)
	}
	round()
	testenv.Poll(t, 15*time.Second, "DELETE /api/kernels/k1", func() bool { return srv.deletes() == 1 })
	r.waitLog("idle kernel holding GPU memory shut down through its server", `"kernel_id":"k1"`)
	for range 2 {
		for _, al := range round() {
			t.Errorf("after the shutdown: %+v", al)
		}
	}
	for _, line := range strings.Split(r.logs.String(), "\n") {
		if strings.Contains(line, `"kernel_id":"k2"`) && strings.Contains(line, "cull") || strings.Contains(line, "warned") && strings.Contains(line, "k2") {
			t.Errorf("the training kernel was culled or warned: %s", line)
		}
	}
}
