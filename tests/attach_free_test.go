package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/api"
)

// gpumemMIME is the mime type under which the magics display their data
// (MIME in magics/py/gpumem_magics/state.py).
const gpumemMIME = "application/vnd.gpumem.v1+json"

// TestAttach is `gpumem attach KERNEL` against a real
// Notebook 6 server: two notebooks a/x.ipynb and b/x.ipynb (with CPU torch
// tensors), a kernel without a server whose id shares its first nine
// characters with a/x.ipynb's kernel, and a kernel whose connection file is
// outside the runtime dirs. KERNEL given as a full id, a unique id prefix, a
// notebook path (absolute and a unique suffix) or a connection file attaches
// to the right kernel; %gpumem vars --all-devices then works there as a
// notebook cell; injecting again is harmless and leaves execution_count,
// In/Out, the user's namespace and IPython's hooks as they were. Ambiguous
// and unknown KERNELs fail, list the candidates and inject nothing.
func TestAttach(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "torch")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)

	a := openSession(t, srv, reap, "a/x.ipynb")
	b := openSession(t, srv, reap, "b/x.ipynb")
	twin := startBareKernel(t, srv.Dir, srv.RuntimeDir(), twinID(a.ID))
	elsewhere := t.TempDir()
	outside := startBareKernel(t, elsewhere, filepath.Join(elsewhere, "runtime"), randomKernelID())

	// What %gpumem vars --all-devices must list in each kernel.
	wantVars := map[string][]varRow{
		a.ID:       {{Name: "w", Type: "Tensor", Device: "cpu", Bytes: 4000}},
		b.ID:       {{Name: "u", Type: "Tensor", Device: "cpu", Bytes: 2000}},
		twin.ID:    nil,
		outside.ID: nil,
	}
	cellOK(t, a, "import torch\nw = torch.zeros(1000)")                     // float32: 4000 bytes
	cellOK(t, b, "import torch\nu = torch.zeros(250, dtype=torch.float64)") // 2000 bytes
	cellOK(t, twin, "x = 1")
	all := []*liveKernel{a, b, twin, outside}
	footprints := map[string]string{}
	for _, k := range all {
		footprints[k.ID] = footprint(t, k)
	}
	env := gpumemEnv(srv.Dir)

	t.Run("unknown kernel", func(t *testing.T) {
		res := runGpumem(t, env, "attach", "no-such-kernel")
		if res.Code != 1 || res.Stdout != "" {
			t.Fatalf("want exit 1 and nothing on stdout\n%s", res)
		}
		if !strings.Contains(res.Stderr, `no kernel matches "no-such-kernel"`) {
			t.Errorf("stderr does not say no kernel matches:\n%s", res.Stderr)
		}
		// The kernels of the runtime dir are the candidates; the one
		// outside it is not known to discovery.
		for _, k := range []*liveKernel{a, b, twin} {
			if !strings.Contains(res.Stderr, k.ID) {
				t.Errorf("stderr does not list running kernel %s (%s):\n%s", k.ID, orNone(k.Notebook), res.Stderr)
			}
		}
	})

	t.Run("empty KERNEL", func(t *testing.T) {
		res := runGpumem(t, env, "attach", "")
		if res.Code != 2 || res.Stderr == "" {
			t.Errorf("want a usage error (exit 2, message)\n%s", res)
		}
	})

	t.Run("ambiguous id prefix", func(t *testing.T) {
		prefix := a.ID[:9]
		res := runGpumem(t, env, "attach", prefix)
		if res.Code != 1 || res.Stdout != "" {
			t.Fatalf("gpumem attach %s (prefix of %s and %s): want exit 1\n%s", prefix, a.ID, twin.ID, res)
		}
		for _, k := range []*liveKernel{a, twin} {
			if !strings.Contains(res.Stderr, k.ID) {
				t.Errorf("stderr does not list candidate %s:\n%s", k.ID, res.Stderr)
			}
		}
		if strings.Contains(res.Stderr, b.ID) {
			t.Errorf("stderr lists %s, which does not start with %s:\n%s", b.ID, prefix, res.Stderr)
		}
	})

	t.Run("ambiguous notebook", func(t *testing.T) {
		res := runGpumem(t, env, "attach", "x.ipynb")
		if res.Code != 1 || res.Stdout != "" {
			t.Fatalf("gpumem attach x.ipynb (a/x.ipynb and b/x.ipynb): want exit 1\n%s", res)
		}
		for _, k := range []*liveKernel{a, b} {
			if !strings.Contains(res.Stderr, k.ID) || !strings.Contains(res.Stderr, k.Notebook) {
				t.Errorf("stderr does not list candidate %s (%s):\n%s", k.ID, k.Notebook, res.Stderr)
			}
		}
		if strings.Contains(res.Stderr, twin.ID) {
			t.Errorf("stderr lists %s, which has no notebook:\n%s", twin.ID, res.Stderr)
		}
	})

	t.Run("nothing injected by a failed attach", func(t *testing.T) {
		for _, k := range all {
			if magicRegistered(t, k) {
				t.Errorf("kernel %s (%s) has %%gpumem after only failed attaches", k.ID, orNone(k.Notebook))
			}
		}
	})

	forms := []struct {
		name   string
		kernel *liveKernel
		arg    string
	}{
		{"full id", a, a.ID},
		{"unique notebook suffix", b, "b/x.ipynb"},
		{"unique id prefix", a, a.ID[:10]},
		{"absolute notebook path", a, a.Notebook},
		{"connection file", b, b.ConnFile},
		{"kernel without a server by id", twin, twin.ID},
		{"connection file outside the runtime dirs", outside, outside.ConnFile},
		{"again", twin, twin.ConnFile},
	}
	injected := map[string]bool{}
	for _, f := range forms {
		t.Run(f.name, func(t *testing.T) {
			k := f.kernel
			res := runGpumem(t, env, "attach", f.arg)
			if res.Code != 0 {
				t.Fatalf("gpumem attach %s: want exit 0\n%s", f.arg, res)
			}
			wantHead := fmt.Sprintf("kernel %s (%s): ", k.ID, orDashNotebook(k.Notebook))
			if !strings.HasPrefix(res.Stdout, wantHead) {
				t.Errorf("gpumem attach %s: stdout does not start with %q (the wrong kernel?):\n%s", f.arg, wantHead, res)
			}
			verb := "injected %gpumem magics"
			if injected[k.ID] {
				verb = "replaced the earlier %gpumem magics"
			}
			if !strings.Contains(res.Stdout, verb) {
				t.Errorf("gpumem attach %s: stdout does not say %q:\n%s", f.arg, verb, res.Stdout)
			}
			injected[k.ID] = true
			if got := footprint(t, k); got != footprints[k.ID] {
				t.Errorf("injection changed the kernel:\nbefore %s\nafter  %s", footprints[k.ID], got)
			}
			// Injection registers one callback, and only it, however many
			// times it runs: the out-of-memory report's post_run_cell hook.
			if got := gpumemCallbacks(t, k); got != "[('post_run_cell', 'oom_hook')]" {
				t.Errorf("gpumem's IPython callbacks: %s, want only the out-of-memory report's post_run_cell hook", got)
			}
			if got := userExpr(t, k, "sorted(m for m in __import__('sys').modules if 'gpumem' in m)"); got != "['_gpumem_magics']" {
				t.Errorf("gpumem's modules in sys.modules: %s, want only ['_gpumem_magics']", got)
			}

			r := k.front.Cell(t, "%gpumem vars --all-devices")
			if r.Status() != "ok" {
				t.Fatalf("%%gpumem vars --all-devices: %s\n%s", r.Status(), r.Text())
			}
			var data struct {
				Kind       string   `json:"kind"`
				Rows       []varRow `json:"rows"`
				TotalBytes uint64   `json:"total_bytes"`
			}
			if !r.Data(gpumemMIME, &data) || data.Kind != "vars" {
				t.Fatalf("%%gpumem vars --all-devices displayed no %s vars data:\n%s", gpumemMIME, r.Text())
			}
			want := wantVars[k.ID]
			var total uint64
			for _, w := range want {
				total += w.Bytes
			}
			if !slices.Equal(data.Rows, want) || data.TotalBytes != total {
				t.Errorf("%%gpumem vars --all-devices: rows %+v total %d, want %+v total %d\n%s", data.Rows, data.TotalBytes, want, total, r.Text())
			}
			if !strings.Contains(r.Text(), "gpumem vars") {
				t.Errorf("%%gpumem vars --all-devices: no text/plain table:\n%s", r.Text())
			}
			footprints[k.ID] = footprint(t, k) // the cell counts
		})
	}

	t.Run("torch never imported by gpumem", func(t *testing.T) {
		for _, k := range []*liveKernel{twin, outside} {
			if got := userExpr(t, k, "'torch' in __import__('sys').modules"); got != "False" {
				t.Errorf("kernel %s never imported torch, yet it is in sys.modules after attach and %%gpumem", k.ID)
			}
		}
	})
}

// TestFree is `gpumem free KERNEL` standalone in a real
// kernel holding CPU tensors a and b, a displayed last (in Out and _), never
// attached: the default frees caches only and touches no variable; --vars a
// deletes a and IPython's hidden references to it (a weakref made in the
// kernel dies) and leaves b; an unknown name deletes nothing; --json prints
// the report; a free on a busy kernel runs after the current cell, which
// completes normally. No free registers a magic or changes
// execution_count, In/Out or the user's namespace.
func TestFree(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "torch")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	k := openSession(t, srv, reap, "free/f.ipynb")
	env := gpumemEnv(srv.Dir)

	cellOK(t, k, "import torch, weakref\na = torch.ones(1000)\nb = torch.ones(2000)\nwa, wb = weakref.ref(a), weakref.ref(b)")
	if r := k.front.Cell(t, "a"); r.Status() != "ok" || !r.Data("text/plain", nil) {
		t.Fatalf("displaying a: %s\n%s", r.Status(), r.Text())
	}
	if got := printed(t, k, "print(any(v is a for v in Out.values()), _ is a)"); got != "True True" {
		t.Fatalf("a should be the last displayed result (in Out, and _): got %q", got)
	}
	// a, b exist; a, b alive.
	const state = "print('a' in globals(), 'b' in globals(), wa() is not None, wb() is not None)"

	// freeChecked runs gpumem free with args and checks what every free
	// must leave alone: the kernel's footprint (with --vars, only the
	// execution count and In when it deletes) and the absence of %gpumem.
	freeChecked := func(t *testing.T, deletes bool, args ...string) result {
		t.Helper()
		look := footprint
		if deletes {
			look = func(t testing.TB, k *liveKernel) string {
				return userExpr(t, k, "(get_ipython().execution_count, len(In))")
			}
		}
		before := look(t, k)
		res := runGpumem(t, env, append([]string{"free", k.ID}, args...)...)
		if got := look(t, k); got != before {
			t.Errorf("gpumem free %s changed the kernel:\nbefore %s\nafter  %s", strings.Join(args, " "), before, got)
		}
		if magicRegistered(t, k) {
			t.Errorf("gpumem free %s registered %%gpumem in a kernel never attached", strings.Join(args, " "))
		}
		return res
	}

	t.Run("cache only", func(t *testing.T) {
		res := freeChecked(t, false)
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		want := fmt.Sprintf("kernel %s (%s)\n", k.ID, k.Notebook)
		if !strings.HasPrefix(res.Stdout, want) || !strings.Contains(res.Stdout, "no variable was touched") {
			t.Errorf("stdout should name the kernel (%q) and say no variable was touched:\n%s", want, res)
		}
		if got := printed(t, k, state); got != "True True True True" {
			t.Errorf("after a cache-only free: a, b exist and alive = %q, want all True", got)
		}
		if got := printed(t, k, "print(_ is a)"); got != "True" {
			t.Errorf("a cache-only free dropped _ (the displayed a)")
		}
	})

	t.Run("cache only json", func(t *testing.T) {
		res := freeChecked(t, false, "--json")
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		rep := decodeFree(t, res)
		if !rep.CacheOnly || rep.DryRun || rep.Error != "" || len(rep.Deleted) != 0 {
			t.Errorf("report %+v, want cache_only, nothing deleted, no error", rep)
		}
		if rep.Driver != nil {
			t.Errorf("standalone free reported a driver figure %+v: only the daemon has one", *rep.Driver)
		}
		if got := printed(t, k, state); got != "True True True True" {
			t.Errorf("after a cache-only free: a, b exist and alive = %q, want all True", got)
		}
	})

	t.Run("unknown variable", func(t *testing.T) {
		res := freeChecked(t, false, "--vars", "a,nope")
		if res.Code != 1 || res.Stdout != "" {
			t.Fatalf("want exit 1 and nothing on stdout\n%s", res)
		}
		for _, want := range []string{k.ID, "no variable named nope", "nothing was deleted"} {
			if !strings.Contains(res.Stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, res.Stderr)
			}
		}
		if got := printed(t, k, state); got != "True True True True" {
			t.Errorf("after a refused free: a, b exist and alive = %q, want all True", got)
		}
	})

	t.Run("vars a", func(t *testing.T) {
		res := freeChecked(t, true, "--vars", "a", "--json")
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		rep := decodeFree(t, res)
		if rep.CacheOnly || len(rep.Deleted) != 1 || rep.Deleted[0].Name != "a" || rep.Deleted[0].Bytes != 4000 || rep.Deleted[0].Alive {
			t.Errorf("report: cache_only %v deleted %+v, want a (4000 bytes) deleted and freed", rep.CacheOnly, rep.Deleted)
		}
		var dropped []string
		for _, h := range rep.Hidden {
			if h.Action == "drop" {
				dropped = append(dropped, strings.Split(h.Ref, "/")...)
			}
		}
		if !slices.ContainsFunc(dropped, func(r string) bool { return strings.HasPrefix(r, "Out[") }) || !slices.Contains(dropped, "_") {
			t.Errorf("hidden references dropped: %q, want Out[N] and _", dropped)
		}
		// The weakref dying proves that nothing (Out, _, _N, the
		// displayhook) holds a any more.
		if got := printed(t, k, state); got != "False True False True" {
			t.Errorf("after --vars a: a, b exist and alive = %q, want a gone and dead, b there and alive", got)
		}
	})

	t.Run("busy kernel", func(t *testing.T) {
		marks := t.TempDir()
		started, done := filepath.Join(marks, "started"), filepath.Join(marks, "done")
		tab := testenv.StartFrontend(t, k.kernel) // a second browser tab runs a long cell
		code := fmt.Sprintf("import pathlib, time\npathlib.Path(%s).touch()\ntime.sleep(3)\npathlib.Path(%s).touch()\nprint('slept')",
			strconv.Quote(started), strconv.Quote(done))
		type reply struct {
			r   testenv.FrontendReply
			err error
		}
		replies := make(chan reply, 1) // buffered: the goroutine never blocks, even if the test ends first
		go func() {
			r, err := tab.Execute(context.Background(), testenv.ExecuteRequest{Code: code, StoreHistory: true})
			replies <- reply{r, err}
		}()
		testenv.Poll(t, 30*time.Second, "the long cell to start", func() bool { return exists(started) })

		res := runGpumem(t, env, "free", k.ID)
		cellDone := exists(done)
		if res.Code != 0 {
			t.Errorf("gpumem free on a busy kernel: want exit 0\n%s", res)
		}
		if !cellDone {
			t.Errorf("gpumem free returned before the running cell ended: it must run after it")
		}
		var got reply
		select {
		case got = <-replies:
		case <-time.After(60 * time.Second):
			t.Fatal("the long cell did not finish within 60 s")
		}
		if got.err != nil {
			t.Fatalf("the long cell: %v", got.err)
		}
		if got.r.Status() != "ok" || got.r.Text() != "slept\n" {
			t.Errorf("the long cell: status %q output %q, want ok and \"slept\\n\" only", got.r.Status(), got.r.Text())
		}
		// A user wondering why nothing happens for minutes deserves the
		// line runFree means to print.
		if !strings.Contains(res.Stderr, "is busy") || !strings.Contains(res.Stderr, "the free runs after it") {
			t.Errorf("gpumem free waited for a running cell without saying so (stderr %q)", res.Stderr)
		}
	})
}

// TestFreeThroughDaemon: with `gpumem serve` running for the runtime dir
// (a simulated GPU lists the kernel's pid), `gpumem free` goes through the
// daemon: the report carries the driver's figure before and after, and the
// daemon logs the free. --vars and unknown names behave as standalone.
// `gpumem attach` on a kernel the daemon injected must keep the daemon's
// notebook alerts; a kernel the daemon does not watch is still freed.
func TestFreeThroughDaemon(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "torch")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	k := openSession(t, srv, reap, "gpu/train.ipynb")
	other := openSession(t, srv, reap, "gpu/other.ipynb")
	cellOK(t, k, "import torch, weakref\na = torch.ones(1000)\nb = torch.ones(2000)\nwa, wb = weakref.ref(a), weakref.ref(b)")
	const state = "print('a' in globals(), 'b' in globals(), wa() is not None, wb() is not None)"

	const gib = 1 << 30
	fake := filepath.Join(t.TempDir(), "gpus.json")
	setFakeGPU := func(t *testing.T, kernelBytes uint64) {
		t.Helper()
		testenv.WriteSimulatedGPUs(t, fake, testenv.SimGPU{Name: "Simulated H200", UUID: "GPU-e2e-daemon", MemoryTotalBytes: 80 * gib,
			Processes: []testenv.FakeProc{{PID: k.PID, UsedBytes: kernelBytes}, {PID: other.PID, UsedBytes: gib}}})
	}
	setFakeGPU(t, gib)
	env := gpumemEnv(srv.Dir, "GPUMEM_FAKE_GPU="+fake)
	d := startServe(t, srv, env, "--alert-threshold=0.5", "--interval=200ms")

	// The daemon has attached and injected (so its client can free), and
	// has attributed the simulated GPU memory to the kernel (so the free
	// has a driver figure).
	for _, nb := range []*liveKernel{k, other} {
		testenv.Poll(t, 30*time.Second, "the daemon to inject %gpumem into "+nb.Notebook, func() bool { return magicRegistered(t, nb) })
	}
	testenv.Poll(t, 30*time.Second, "the daemon to attribute 1 GiB to "+k.Notebook, func() bool {
		res := runGpumem(t, env, "ls", "--json")
		var rep lsReport
		if res.Code != 0 || json.Unmarshal([]byte(res.Stdout), &rep) != nil {
			return false
		}
		i := slices.IndexFunc(rep.Notebooks, func(nb lsNotebook) bool { return nb.KernelID == k.ID })
		return i >= 0 && rep.Notebooks[i].GPUMemoryBytes == gib
	})

	t.Run("cache only", func(t *testing.T) {
		res := runGpumem(t, env, "free", k.ID, "--json")
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(res.Stdout), &raw); err != nil {
			t.Fatalf("not a JSON object: %v\n%s", err, res)
		}
		if _, ok := raw["driver"]; !ok {
			t.Errorf("no \"driver\" figure in the report: the free did not go through the daemon\n%s", res.Stdout)
		}
		rep := decodeFree(t, res)
		if !rep.CacheOnly || len(rep.Deleted) != 0 {
			t.Errorf("report %+v, want cache_only and nothing deleted", rep)
		}
		if rep.Driver != nil && (rep.Driver.Before != gib || rep.Driver.After != gib) {
			t.Errorf("driver before %d after %d, want %d both (the simulated GPU did not change)", rep.Driver.Before, rep.Driver.After, uint64(gib))
		}
		// The log line comes through a pipe, maybe after the reply.
		testenv.Poll(t, 10*time.Second, "the daemon's log line for the free", func() bool {
			return d.logged("freed GPU memory on request", k.ID)
		})
		if got := printed(t, k, state); got != "True True True True" {
			t.Errorf("after a cache-only free: a, b exist and alive = %q, want all True", got)
		}
	})

	t.Run("text", func(t *testing.T) {
		res := runGpumem(t, env, "free", k.ID)
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		for _, want := range []string{"kernel| gpumem free: emptied the caches; no variable was touched",
			"\ndriver (NVML, read by gpumem serve): 1.0 GiB -> 1.0 GiB for this kernel (0 B)"} {
			if !strings.Contains(res.Stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, res.Stdout)
			}
		}
	})

	t.Run("unknown variable", func(t *testing.T) {
		res := runGpumem(t, env, "free", k.ID, "--vars", "a,nope")
		if res.Code != 1 || res.Stdout != "" {
			t.Fatalf("want exit 1 and nothing on stdout\n%s", res)
		}
		for _, want := range []string{"no variable named nope", "nothing was deleted"} {
			if !strings.Contains(res.Stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, res.Stderr)
			}
		}
		if got := printed(t, k, state); got != "True True True True" {
			t.Errorf("after a refused free: a, b exist and alive = %q, want all True", got)
		}
	})

	t.Run("vars a", func(t *testing.T) {
		res := runGpumem(t, env, "free", k.ID, "--vars", "a", "--json")
		if res.Code != 0 {
			t.Fatalf("want exit 0\n%s", res)
		}
		rep := decodeFree(t, res)
		if len(rep.Deleted) != 1 || rep.Deleted[0].Name != "a" || rep.Deleted[0].Alive || rep.Driver == nil {
			t.Errorf("report: deleted %+v driver %v, want a deleted and freed, and a driver figure", rep.Deleted, rep.Driver)
		}
		if got := printed(t, k, state); got != "False True False True" {
			t.Errorf("after --vars a: a, b exist and alive = %q, want a gone and dead, b there and alive", got)
		}
	})

	t.Run("attach keeps the daemon's notebook alerts", func(t *testing.T) {
		res := runGpumem(t, env, "attach", k.ID)
		if res.Code != 0 || !strings.Contains(res.Stdout, "replaced the earlier %gpumem magics") {
			t.Fatalf("gpumem attach on a kernel the daemon injected: want exit 0, \"replaced the earlier\"\n%s", res)
		}
		setFakeGPU(t, 50*gib) // 51 of 80 GiB: over --alert-threshold=0.5
		// The kernel attach did not touch gets the alert...
		alerted := func(nb *liveKernel) func() bool {
			return func() bool { return strings.Contains(nb.front.Cell(t, "pass").Text(), "gpumem: GPU 0") }
		}
		testenv.Poll(t, 20*time.Second, "the alert line in "+other.Notebook, alerted(other))
		// ...and so must the one it re-injected: it uses that GPU too.
		deadline := time.Now().Add(5 * time.Second)
		for !alerted(k)() {
			if time.Now().After(deadline) {
				t.Fatalf("no alert line in %s, re-injected by `gpumem attach`, while %s got one: "+
					"cmd/gpumem/cli/attach.go runAttach injects with InjectOptions{KernelID, SidecarSocket} but no AlertFile, "+
					"and the bootstrap's uninstall() of the daemon's injection unregisters alert_hook, so attach silently "+
					"turns the daemon's notebook alerts off in that kernel (the daemon injects once per kernel process and never repairs it)",
					k.Notebook, other.Notebook)
			}
		}
	})

	t.Run("kernel the daemon does not watch", func(t *testing.T) {
		elsewhere := t.TempDir() // the kernel's connection file is outside the daemon's runtime dirs
		bare := startBareKernel(t, elsewhere, filepath.Join(elsewhere, "runtime"), randomKernelID())
		res := runGpumem(t, env, "free", bare.ConnFile)
		if res.Code != 0 || !strings.Contains(res.Stdout, "no variable was touched") {
			t.Errorf("gpumem free on a kernel the daemon does not watch: want exit 0 and a cache-only report\n%s\n"+
				"cmd/gpumem/cli/attach.go runFree falls back to a standalone free only on api.ErrNoDaemon; "+
				"the daemon's 404 (kernel not known to it) ends the command, though the CLI resolved the kernel itself", res)
		}
	})
}

// liveKernel is a running kernel and a frontend attached to it, as a
// notebook's browser tab is.
type liveKernel struct {
	ID       string
	Notebook string // absolute path; "" for a kernel without a server
	ConnFile string
	PID      int
	kernel   *testenv.Kernel
	front    *testenv.Frontend
}

// openSession creates notebook path on srv with a kernel, attaches a
// frontend, and has reap kill the kernel.
func openSession(t *testing.T, srv *testenv.Server, reap *testenv.Reaper, path string) *liveKernel {
	t.Helper()
	sess := srv.CreateSession(t, path)
	k := &testenv.Kernel{Dir: srv.Dir, ConnectionFile: srv.ConnectionFile(sess.Kernel.ID), ID: sess.Kernel.ID}
	lk := liveKernelOf(t, k, filepath.Join(srv.RootDir, filepath.FromSlash(path)))
	reap.Add(lk.PID)
	return lk
}

// liveKernelOf attaches a frontend to k and asks the kernel its pid.
func liveKernelOf(t *testing.T, k *testenv.Kernel, notebook string) *liveKernel {
	t.Helper()
	testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	lk := &liveKernel{ID: k.ID, Notebook: notebook, ConnFile: k.ConnectionFile, kernel: k, front: testenv.StartFrontend(t, k)}
	pid, err := strconv.Atoi(printed(t, lk, "import os; print(os.getpid())"))
	if err != nil {
		t.Fatalf("kernel %s: pid: %v", k.ID, err)
	}
	lk.PID = pid
	return lk
}

// startBareKernel starts an ipykernel without a server, with connection
// file runtimeDir/kernel-<id>.json (so id is its kernel id), and attaches a
// frontend. The file does not exist beforehand: ipykernel binds ports of its
// own choosing and writes it. (Ports chosen for it in advance, as
// testenv.ConnectionJSON does, can be taken by another process before the
// kernel binds them: with many kernels starting at once, its heartbeat port
// was seen served by another kernel's PULL socket.)
func startBareKernel(t *testing.T, dir, runtimeDir, id string) *liveKernel {
	t.Helper()
	testenv.Require(t, "ipykernel")
	cf := filepath.Join(runtimeDir, "kernel-"+id+".json")
	p := testenv.Start(t, testenv.Env(dir), dir, testenv.Python(), "-m", "ipykernel_launcher", "-f", cf)
	return liveKernelOf(t, &testenv.Kernel{Proc: p, Dir: dir, ConnectionFile: cf, ID: id}, "")
}

// randomKernelID is a fresh kernel id in the uuid form Jupyter uses.
func randomKernelID() string {
	return fmt.Sprintf("%s-%s-%s-%s-%s", testenv.RandomHex(4), testenv.RandomHex(2), testenv.RandomHex(2), testenv.RandomHex(2), testenv.RandomHex(6))
}

// twinID is a kernel id sharing id's first nine characters (eight hex
// digits and a dash) and differing in the tenth.
func twinID(id string) string {
	c := "0"
	if id[9] == '0' {
		c = "1"
	}
	return id[:9] + c + id[10:]
}

// cellOK runs code as a notebook cell and fails the test unless it
// succeeds.
func cellOK(t testing.TB, k *liveKernel, code string) testenv.FrontendReply {
	t.Helper()
	r := k.front.Cell(t, code)
	if r.Status() != "ok" {
		t.Fatalf("cell %q in %s: %s\n%s", code, k.ID, r.Status(), r.Text())
	}
	return r
}

// printed runs code as a notebook cell and returns what it printed, trimmed.
func printed(t testing.TB, k *liveKernel, code string) string {
	t.Helper()
	return strings.TrimSpace(cellOK(t, k, code).Text())
}

// userExpr evaluates expr in the kernel through a silent execute's
// user_expressions (no execution count, no history, no output) and returns
// its text/plain.
func userExpr(t testing.TB, k *liveKernel, expr string) string {
	t.Helper()
	r, err := k.front.Execute(context.Background(), testenv.ExecuteRequest{Silent: true, UserExpressions: map[string]string{"v": expr}})
	if err != nil {
		t.Fatalf("kernel %s: user expression %q: %v", k.ID, expr, err)
	}
	var reply struct {
		UserExpressions map[string]struct {
			Status string            `json:"status"`
			Data   map[string]string `json:"data"`
			EName  string            `json:"ename"`
			EValue string            `json:"evalue"`
		} `json:"user_expressions"`
	}
	if err := json.Unmarshal(r.Reply, &reply); err != nil {
		t.Fatalf("kernel %s: execute_reply %s: %v", k.ID, r.Reply, err)
	}
	v, ok := reply.UserExpressions["v"]
	if !ok || v.Status != "ok" {
		t.Fatalf("kernel %s: user expression %q: %s: %s %s", k.ID, expr, v.Status, v.EName, v.EValue)
	}
	return v.Data["text/plain"]
}

// footprint is what gpumem must leave as it was in a kernel: the execution
// count, In/Out, the user's names, and IPython's event hooks.
func footprint(t testing.TB, k *liveKernel) string {
	t.Helper()
	return userExpr(t, k, "(get_ipython().execution_count, len(In), sorted(Out), "+
		"sorted(n for n in get_ipython().user_ns if not n.startswith('_')), "+
		"{e: len([c for c in f if not "+isGpumemCallback+"]) for e, f in sorted(get_ipython().events.callbacks.items())})")
}

// isGpumemCallback (a Python expression of c) says whether an IPython event
// callback is one of gpumem's, whose package is _gpumem_magics.
const isGpumemCallback = "(getattr(c, '__module__', None) or '').startswith('_gpumem_magics')"

// gpumemCallbacks lists the IPython event callbacks gpumem registered, as
// (event, name) pairs.
func gpumemCallbacks(t testing.TB, k *liveKernel) string {
	t.Helper()
	return userExpr(t, k, "sorted((e, c.__name__) for e, f in get_ipython().events.callbacks.items() for c in f if "+isGpumemCallback+")")
}

// magicRegistered reports whether %gpumem is registered in the kernel.
func magicRegistered(t testing.TB, k *liveKernel) bool {
	t.Helper()
	return userExpr(t, k, "get_ipython().find_line_magic('gpumem') is not None") == "True"
}

// varRow is one row of %gpumem vars' data (the fields tested).
type varRow struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Device string `json:"device"`
	Bytes  uint64 `json:"bytes"`
}

// freeJSON is `gpumem free --json`, decoded independently of magics.FreeReport.
type freeJSON struct {
	DryRun    bool   `json:"dry_run"`
	CacheOnly bool   `json:"cache_only"`
	Error     string `json:"error"`
	Deleted   []struct {
		Name  string `json:"name"`
		Bytes uint64 `json:"bytes"`
		Alive bool   `json:"alive"`
	} `json:"deleted"`
	Hidden []struct {
		Ref    string `json:"ref"`
		Action string `json:"action"`
	} `json:"hidden"`
	Frameworks []json.RawMessage `json:"frameworks"`
	Driver     *struct {
		Before uint64 `json:"before"`
		After  uint64 `json:"after"`
	} `json:"driver"`
	ElapsedMS *int64 `json:"elapsed_ms"`
}

func decodeFree(t testing.TB, res result) freeJSON {
	t.Helper()
	var rep freeJSON
	if err := json.Unmarshal([]byte(res.Stdout), &rep); err != nil {
		t.Fatalf("gpumem free --json: %v\n%s", err, res)
	}
	if rep.ElapsedMS == nil || rep.Frameworks == nil {
		t.Errorf("gpumem free --json lacks elapsed_ms or frameworks:\n%s", res.Stdout)
	}
	return rep
}

// serveProc is a running `gpumem serve`.
type serveProc struct {
	*testenv.Proc
	socket string
}

// startServe runs `gpumem serve` with env for srv's runtime dir (killed in
// t.Cleanup) and waits until its API answers.
func startServe(t *testing.T, srv *testenv.Server, env []string, args ...string) *serveProc {
	t.Helper()
	argv := append([]string{gpumemBin, "serve", "--log-format=json"}, args...)
	d := &serveProc{Proc: testenv.Start(t, env, srv.Dir, argv...), socket: filepath.Join(srv.RuntimeDir(), api.DefaultSocketName)}
	c := api.NewClient(d.socket)
	t.Cleanup(func() {
		c.Close()
		if t.Failed() {
			t.Logf("gpumem serve's log:\n%s", d.Output())
		}
	})
	testenv.Poll(t, 30*time.Second, "gpumem serve's API on "+d.socket, func() bool {
		if d.Exited() {
			t.Fatalf("gpumem serve exited:\n%s", d.Output())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return c.Healthz(ctx) == nil
	})
	return d
}

// logged reports whether the daemon logged message for kernelID.
func (d *serveProc) logged(message, kernelID string) bool {
	for _, line := range strings.Split(d.Output(), "\n") {
		var entry struct {
			Message  string `json:"message"`
			KernelID string `json:"kernel_id"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Message == message && entry.KernelID == kernelID {
			return true
		}
	}
	return false
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// orDashNotebook is the notebook as gpumem prints it: "-" for none.
func orDashNotebook(nb string) string {
	if nb == "" {
		return "-"
	}
	return nb
}

func orNone(nb string) string {
	if nb == "" {
		return "no notebook"
	}
	return nb
}
