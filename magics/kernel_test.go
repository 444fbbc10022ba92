package magics_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// stateProbe prints what injection must not change. It runs as a normal
// cell: during a cell, last_execution_result is still the previous cell's.
const stateProbe = `import json as _j, sys as _s, linecache as _lc
_ip = get_ipython()
_ler = _ip.last_execution_result
print(_j.dumps({
  "execution_count": _ip.execution_count,
  "n_in": len(In), "n_hist": len(_ip.history_manager.input_hist_raw),
  "out_keys": sorted(Out), "under": repr(_),
  "last_value": repr(getattr(_s, "last_value", None)),
  "last_tb_frames": len(__import__("traceback").extract_tb(_s.last_traceback)) if getattr(_s, "last_traceback", None) else 0,
  "ler_count": getattr(_ler, "execution_count", None),
  "ler_error_is_last_value": _ler is not None and _ler.error_in_exec is getattr(_s, "last_value", None),
  "ler_succeeded": _ip.last_execution_succeeded,
  "names": sorted(k for k in _ip.user_ns if not k.startswith("_") and k not in ("json",) and not ` + testenv.KernelOwnNames + `),
  "inject_in_history": any("gpumem-" "inject" in c for c in In),
  "inject_in_linecache": [k for k, e in list(_lc.cache.items()) if len(e) > 2 and e[2] and "gpumem-" "inject" in e[2][0]],
  "report_modules": [m for m in _s.modules if m.startswith("_gpumem_report")],
  "torch": "torch" in _s.modules,
}))`

type kernelState struct {
	ExecutionCount      int      `json:"execution_count"`
	NIn                 int      `json:"n_in"`
	NHist               int      `json:"n_hist"`
	OutKeys             []int    `json:"out_keys"`
	Under               string   `json:"under"`
	LastValue           string   `json:"last_value"`
	LastTBFrames        int      `json:"last_tb_frames"`
	LERCount            *int     `json:"ler_count"`
	LERErrorIsLastValue bool     `json:"ler_error_is_last_value"`
	LERSucceeded        bool     `json:"ler_succeeded"`
	Names               []string `json:"names"`
	InjectInHistory     bool     `json:"inject_in_history"`
	InjectInLinecache   []string `json:"inject_in_linecache"`
	ReportModules       []string `json:"report_modules"`
	Torch               bool     `json:"torch"`
}

// TestInjectLeavesKernelUntouched: execution_count, In/Out, history,
// sys.last_*, last_execution_result and the namespace are as before, after
// two injections; the second replaces the first.
func TestInjectLeavesKernelUntouched(t *testing.T) {
	s := newSession(t)
	s.cell("x = 41", true)
	s.cell("x + 1", true) // Out[2], _
	r := s.cell("def f():\n    raise ValueError('boom')\nf()", false)
	if r.Status() != "error" {
		t.Fatalf("cell 3 should raise; got %s", r.Status())
	}
	res := s.inject(magics.InjectOptions{})
	if !res.Injected || res.Replaced || res.Language != "python" || res.Version != magics.Version() {
		t.Fatalf("first inject: %+v", res)
	}
	res = s.inject(magics.InjectOptions{})
	if !res.Injected || !res.Replaced {
		t.Fatalf("second inject should replace the first: %+v", res)
	}
	var st kernelState
	r = s.probe(stateProbe, &st)
	// IPython 9 counts the running cell in execution_count and IPython 8
	// does not; the probe's reply's count (the In[N] a notebook shows) is
	// the same on both: the probe is the fourth cell.
	st.ExecutionCount = r.ExecutionCount()
	three := 3
	want := kernelState{
		ExecutionCount: 4, NIn: 5, NHist: 5, OutKeys: []int{2}, Under: "42",
		LastValue: "ValueError('boom')", LastTBFrames: 3, LERCount: &three, LERErrorIsLastValue: true,
		LERSucceeded: false, Names: []string{"In", "Out", "exit", "f", "get_ipython", "quit", "x"},
		InjectInLinecache: []string{}, ReportModules: []string{},
	}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("kernel state after two injections:\n got %+v\nwant %+v", st, want)
	}
	// The magics work, once.
	data, text := s.magic("%gpumem help")
	if data["kind"] != "help" || strings.Count(text, "%gpumem vars") != 1 {
		t.Errorf("help after re-injection: %v\n%s", data, text)
	}
}

// TestInjectBusyKernel: an injection sent while a cell runs waits for the
// cell (shell queue order) and then succeeds.
func TestInjectBusyKernel(t *testing.T) {
	s := newSession(t)
	other := testenv.StartFrontend(t, s.k) // the user's browser tab
	dir := t.TempDir()
	started, ended := filepath.Join(dir, "started"), filepath.Join(dir, "ended")
	code := "import time, pathlib\npathlib.Path(" + pyQuote(started) + ").touch()\ntime.sleep(1.5)\npathlib.Path(" + pyQuote(ended) + ").touch()"
	done := make(chan testenv.FrontendReply, 1)
	errc := make(chan error, 1)
	go func() {
		r, err := other.Execute(context.Background(), testenv.ExecuteRequest{Code: code, StoreHistory: true})
		if err != nil {
			errc <- err
			return
		}
		done <- r
	}()
	testenv.Poll(t, 30*time.Second, "the busy cell to start", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	t0 := time.Now()
	res := s.inject(magics.InjectOptions{})
	if !res.Injected {
		t.Fatalf("inject into a busy kernel: %+v", res)
	}
	if _, err := os.Stat(ended); err != nil {
		t.Fatalf("inject returned after %v while the cell was still running", time.Since(t0))
	}
	select {
	case r := <-done:
		if r.Status() != "ok" {
			t.Errorf("the user's cell: %s", r.Text())
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatal("the user's cell never finished")
	}
	data, _ := s.magic("%gpumem")
	if data["kind"] != "summary" {
		t.Errorf("%%gpumem after busy inject: %v", data)
	}
}

// TestKernelWithoutTorch: every magic works in a kernel that never
// imported torch, and none of them imports it.
func TestKernelWithoutTorch(t *testing.T) {
	s := newSession(t)
	s.cell("import sys\nx = [1, 2, 3]", true)
	s.inject(magics.InjectOptions{})
	data, text := s.magic("%gpumem")
	if !strings.Contains(text, "No GPU framework (PyTorch, CuPy, JAX, TensorFlow) is loaded") {
		t.Errorf("%%gpumem without frameworks:\n%s", text)
	}
	if _, ok := data["driver_hint"]; !ok {
		t.Errorf("%%gpumem without a sidecar should say how to get the driver's figure: %v", data)
	}
	for _, line := range []string{"%gpumem vars", "%gpumem vars --all-devices", "%gpumem free", "%gpumem free --all", "%gpumem free x --dry-run", "%gpumem help"} {
		s.magic(line)
	}
	s.cell("%%gpumem\ny = sum(x)", true)
	ctx := context.Background()
	fr, err := magics.FreeCache(ctx, s.ex, magics.FreeOptions{})
	if err != nil || !fr.CacheOnly {
		t.Fatalf("FreeCache: %+v %v", fr, err)
	}
	var st kernelState
	s.probe(stateProbe, &st)
	if st.Torch {
		t.Fatal("torch is in sys.modules after gpumem's magics ran")
	}
	var v struct{ X []int }
	s.probe("import json; print(json.dumps({'X': x}))", &v)
	if !reflect.DeepEqual(v.X, []int{1, 2, 3}) {
		t.Errorf("x changed: %v", v.X)
	}
}

// TestUnsupportedKernel: a kernel whose language is not Python gets
// nothing: no execute_request is sent.
func TestUnsupportedKernel(t *testing.T) {
	for _, ki := range []protocol.KernelInfo{
		{Language: "R", Implementation: "IRkernel", LanguageVersion: "4.3.1"},
		{Language: "python", Implementation: "ipython", LanguageVersion: "2.7.18"},
	} {
		ex := &fakeExecutor{info: ki}
		res, err := magics.Inject(context.Background(), ex, magics.InjectOptions{})
		if !errors.Is(err, magics.ErrUnsupportedKernel) || res.Injected || res.Reason == "" || ex.executed != 0 {
			t.Errorf("%s %s: got %+v, %v, %d executes", ki.Language, ki.LanguageVersion, res, err, ex.executed)
		}
		if !strings.HasPrefix(res.String(), "nothing was injected: ") {
			t.Errorf("String(): %q", res.String())
		}
		if _, err := magics.FreeCache(context.Background(), ex, magics.FreeOptions{}); !errors.Is(err, magics.ErrUnsupportedKernel) {
			t.Errorf("FreeCache on %s: %v", ki.Language, err)
		}
	}
}

// TestNoIPythonShell: a Python kernel without IPython (the bootstrap finds
// no shell) is reported as unsupported, with the bootstrap's reason.
func TestNoIPythonShell(t *testing.T) {
	ex := &fakeExecutor{info: protocol.KernelInfo{Language: "python", LanguageVersion: "3.12.1"},
		runPython: true}
	res, err := magics.Inject(context.Background(), ex, magics.InjectOptions{})
	if !errors.Is(err, magics.ErrUnsupportedKernel) || res.Injected || !strings.Contains(res.Reason, "no IPython shell") {
		t.Fatalf("got %+v, %v", res, err)
	}
}

type fakeExecutor struct {
	info      protocol.KernelInfo
	executed  int
	runPython bool // run the code in a plain python3 (no IPython) and answer with its report
}

func (f *fakeExecutor) KernelInfo(context.Context) (protocol.KernelInfo, error) { return f.info, nil }

func (f *fakeExecutor) Execute(ctx context.Context, code string, opts protocol.ExecuteOptions) (protocol.ExecuteReply, error) {
	f.executed++
	if !f.runPython {
		return protocol.ExecuteReply{}, errors.New("fake: no kernel")
	}
	return runPlainPython(ctx, code, opts)
}

func pyQuote(s string) string {
	return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), "'", `\'`) + "'"
}

// TestFreeCacheDriverFigure: with DriverBytes, FreeCache reports the
// caller's driver figure before and after, and Render (what `gpumem free`
// prints) says it; the kernel asks no daemon itself. Both with the magics
// injected and without (the package then runs under a private name and
// leaves nothing in sys.modules).
func TestFreeCacheDriverFigure(t *testing.T) {
	s := newSession(t)
	for _, injected := range []bool{false, true} {
		if injected {
			s.inject(magics.InjectOptions{})
		}
		readings := []uint64{1 << 30, 1 << 29}
		calls := 0
		driver := func(context.Context) *uint64 {
			if calls >= len(readings) {
				t.Errorf("DriverBytes called %d times, want %d", calls+1, len(readings))
				return nil
			}
			calls++
			return &readings[calls-1]
		}
		fr, err := magics.FreeCache(context.Background(), s.ex, magics.FreeOptions{DriverBytes: driver})
		if err != nil {
			t.Fatalf("injected=%v: %v", injected, err)
		}
		if calls != 2 || fr.Driver == nil || fr.Driver.Before != 1<<30 || fr.Driver.After != 1<<29 || !fr.CacheOnly {
			t.Errorf("injected=%v: %d readings, report %+v", injected, calls, fr)
		}
		for _, want := range []string{"  kernel| gpumem free: emptied the caches; no variable was touched\n",
			"\ndriver (NVML, read by gpumem serve): 1.0 GiB -> 512.0 MiB for this kernel (-512.0 MiB)"} {
			if !strings.Contains(fr.Render(), want) {
				t.Errorf("injected=%v: rendered report lacks %q:\n%s", injected, want, fr.Render())
			}
		}
		if strings.Contains(fr.Text, "driver (NVML)") {
			t.Errorf("injected=%v: the kernel rendered a driver line itself:\n%s", injected, fr.Text)
		}
	}
	var mods []string
	s.probe("import sys, json; print(json.dumps(sorted(m for m in sys.modules if 'gpumem' in m)))", &mods)
	if strings.Join(mods, ",") != "_gpumem_magics" {
		t.Errorf("gpumem's modules in the kernel: %v", mods)
	}
}
