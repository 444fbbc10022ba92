package magics_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/magics"
)

type varRow struct {
	Name       string   `json:"name"`
	Type       string   `json:"type"`
	Device     string   `json:"device"`
	Bytes      uint64   `json:"bytes"`
	SharedWith []string `json:"shared_with"`
	Hidden     bool     `json:"hidden"`
}

type varsData struct {
	Kind       string   `json:"kind"`
	AllDevices bool     `json:"all_devices"`
	Rows       []varRow `json:"rows"`
	TotalBytes uint64   `json:"total_bytes"`
}

func torchSession(t *testing.T) *session {
	t.Helper()
	testenv.Require(t, "torch")
	s := newSession(t)
	s.inject(magics.InjectOptions{})
	return s
}

// TestVarsAllDevices: a model, its optimizer, tensors, a view and a tuple,
// with exact byte counts; shared storage counted once.
func TestVarsAllDevices(t *testing.T) {
	s := torchSession(t)
	s.cell(`import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model(torch.randn(4, 10)).sum().backward()
opt.step()
a = torch.zeros(1000)
b = a[:500]
c = torch.ones(256, dtype=torch.float64)
pair = (c, torch.zeros(10))
n = 3`, true)
	raw, text := s.magic("%gpumem vars --all-devices")
	var got varsData
	remarshal(t, raw, &got)
	// model: Linear 200+20 and BatchNorm 20+20 float32 parameters (1040 B),
	// their grads (1040 B), buffers running_mean/var (160 B) and
	// num_batches_tracked (8 B). opt: the same parameters and grads, and
	// SGD's momentum buffers (1040 B). The model claims the parameters (a
	// module is a more direct holder than an optimizer), c its storage
	// (before the tuple holding it), a before its view b.
	want := []varRow{
		{Name: "a", Type: "Tensor", Device: "cpu", Bytes: 4000},
		{Name: "b", Type: "Tensor", Device: "cpu", Bytes: 4000, SharedWith: []string{"a"}},
		{Name: "opt", Type: "SGD", Device: "cpu", Bytes: 3120, SharedWith: []string{"model"}},
		{Name: "model", Type: "Sequential", Device: "cpu", Bytes: 2248},
		{Name: "pair", Type: "tuple", Device: "cpu", Bytes: 2088, SharedWith: []string{"c"}},
		{Name: "c", Type: "Tensor", Device: "cpu", Bytes: 2048},
	}
	const total = 4000 + 2248 + 1040 + 2048 + 40
	if !reflect.DeepEqual(got.Rows, want) || got.TotalBytes != total {
		t.Errorf("vars --all-devices:\n got %+v total %d\nwant %+v total %d\n%s", got.Rows, got.TotalBytes, want, total, text)
	}
	// Without --all-devices, CPU tensors are not GPU memory.
	raw, _ = s.magic("%gpumem vars")
	remarshal(t, raw, &got)
	if len(got.Rows) != 0 || got.TotalBytes != 0 {
		t.Errorf("vars (GPU only) on CPU: %+v", got)
	}
	// The text rendering is deterministic: golden.
	checkGolden(t, "live_vars_all_devices.txt", text)
}

const freeSetup = `import torch, weakref, sys, json
a = torch.zeros(1000)
wa = weakref.ref(a)
keep = torch.ones(10)
other = [1, 2]
def f(x):
    global wy
    y = x * 2
    wy = weakref.ref(y)
    raise ValueError("boom")`

const idsProbe = `print(json.dumps({
  "ids": {k: id(v) for k, v in get_ipython().user_ns.items() if not k.startswith("_") and k not in ("a", "b")},
  "out": sorted(Out), "a": "a" in dir(), "b": "b" in dir(),
  "wa": wa() is not None, "wb": wb() is not None, "wy": wy() is not None,
  "under_is_a": "a" in dir() and _ is a,
  "last_value": repr(getattr(sys, "last_value", None)),
}))`

type idsState struct {
	IDs       map[string]int64 `json:"ids"`
	Out       []int            `json:"out"`
	A, B      bool
	WA        bool   `json:"wa"`
	WB        bool   `json:"wb"`
	WY        bool   `json:"wy"`
	UnderIsA  bool   `json:"under_is_a"`
	LastValue string `json:"last_value"`
}

// TestFreeDisplayedAndTraceback: %gpumem free a b frees both while a is
// the last displayed result (Out, _) and b is held by the traceback of an
// exception raised inside a function; weakrefs prove it. Every other
// variable is untouched; --dry-run and an unknown name free nothing.
func TestFreeDisplayedAndTraceback(t *testing.T) {
	s := torchSession(t)
	s.cell(freeSetup, true)
	s.cell("a", true) // Out[2], _, _2
	raise := "b = torch.ones(2000)\nwb = weakref.ref(b)\nf(b)"
	if r := s.cell(raise, false); r.Status() != "error" {
		t.Fatalf("the raising cell: %s", r.Status())
	}
	var before idsState
	s.probe(idsProbe, &before)
	if !before.WA || !before.WB || !before.WY || !before.UnderIsA || !reflect.DeepEqual(before.Out, []int{2}) {
		t.Fatalf("setup: %+v", before)
	}

	// An unknown name: an error, nothing deleted.
	data, text := s.magic("%gpumem free a zzz b")
	if !strings.Contains(text, "no variable named zzz") || !strings.Contains(text, "nothing was deleted") || data["error"] == nil {
		t.Errorf("unknown name:\n%s", text)
	}
	// --dry-run: lists a and b and the hidden references, frees nothing.
	data, text = s.magic("%gpumem free a b --dry-run")
	if data["dry_run"] != true || !strings.Contains(text, "would drop Out[2]/_") ||
		!strings.Contains(text, "would drop ValueError traceback: f() locals") {
		t.Errorf("dry run:\n%s", text)
	}
	var mid idsState
	s.probe(idsProbe, &mid)
	if !mid.A || !mid.B || !mid.WA || !mid.WB || !mid.WY || !mid.UnderIsA || !reflect.DeepEqual(mid.Out, []int{2}) {
		t.Fatalf("after the unknown name and the dry run, something was freed: %+v", mid)
	}
	// The probes replaced last_execution_result; raise again so the
	// traceback is held everywhere IPython holds one.
	if r := s.cell("f(b)", false); r.Status() != "error" {
		t.Fatalf("re-raise: %s", r.Status())
	}
	_, text = s.magic("%gpumem free a b")
	var after idsState
	s.probe(idsProbe, &after)
	if after.A || after.B || after.WA || after.WB || after.WY {
		t.Errorf("after free a b, still alive: %+v\n%s", after, text)
	}
	if after.UnderIsA || len(after.Out) != 0 {
		t.Errorf("hidden references left: %+v", after)
	}
	if !strings.HasPrefix(after.LastValue, "ValueError(") {
		t.Errorf("sys.last_value should stay (only its frames' locals are cleared): %s", after.LastValue)
	}
	delete(before.IDs, "wy") // f rebinds the global wy on every call
	delete(after.IDs, "wy")
	if !reflect.DeepEqual(before.IDs, after.IDs) {
		t.Errorf("other variables changed:\nbefore %v\n after %v", before.IDs, after.IDs)
	}
	for _, want := range []string{"a     Tensor  cpu     3.9 KiB  freed", "b     Tensor  cpu     7.8 KiB  freed", "dropped Out[2]/_2/_"} {
		if !strings.Contains(text, want) {
			t.Errorf("free report lacks %q:\n%s", want, text)
		}
	}
}

// TestFreeCacheAPI: the Go API for `gpumem free KERNEL`. Cache-only touches
// no variable; named variables are freed; an unknown one is refused; it
// works in a kernel where the magics were never injected, registering none.
func TestFreeCacheAPI(t *testing.T) {
	testenv.Require(t, "torch")
	s := newSession(t)
	s.cell("import torch, weakref\na = torch.zeros(100)\nwa = weakref.ref(a)", true)
	s.cell("a", true)
	ctx := context.Background()
	fr, err := magics.FreeCache(ctx, s.ex, magics.FreeOptions{})
	if err != nil || !fr.CacheOnly || len(fr.Deleted) != 0 {
		t.Fatalf("cache-only: %+v %v", fr, err)
	}
	var alive struct{ A, Out bool }
	s.probe("import json; print(json.dumps({'A': wa() is not None, 'Out': 2 in Out}))", &alive)
	if !alive.A || !alive.Out {
		t.Fatalf("cache-only free touched variables: %+v", alive)
	}
	_, err = magics.FreeCache(ctx, s.ex, magics.FreeOptions{Vars: []string{"nope"}})
	if !errors.Is(err, magics.ErrFreeRefused) || !strings.Contains(err.Error(), "no variable named nope") {
		t.Fatalf("unknown var: %v", err)
	}
	fr, err = magics.FreeCache(ctx, s.ex, magics.FreeOptions{Vars: []string{"a"}})
	if err != nil || len(fr.Deleted) != 1 || fr.Deleted[0].Name != "a" || fr.Deleted[0].Bytes != 400 || fr.Deleted[0].Alive {
		t.Fatalf("free a: %+v %v", fr, err)
	}
	s.probe("import json; print(json.dumps({'A': wa() is not None, 'Out': 2 in Out}))", &alive)
	if alive.A || alive.Out {
		t.Fatalf("free a left it alive: %+v", alive)
	}
	var reg struct{ Line, Mod bool }
	s.probe("import json, sys; print(json.dumps({'Line': 'gpumem' in get_ipython().magics_manager.magics['line'], 'Mod': '_gpumem_magics' in sys.modules}))", &reg)
	if reg.Line || reg.Mod {
		t.Errorf("FreeCache registered magics in a kernel that was never injected: %+v", reg)
	}
	if !strings.Contains(fr.Text, "deleted:") {
		t.Errorf("text: %s", fr.Text)
	}
}

// TestCellMagic: %%gpumem runs the cell in the user's namespace, returns
// its last value as Out, and reports.
func TestCellMagic(t *testing.T) {
	s := torchSession(t)
	r := s.cell("%%gpumem\nimport torch\nt = torch.ones(3)\nint(t.sum())", true)
	var data map[string]any
	if !r.Data("application/vnd.gpumem.v1+json", &data) || data["kind"] != "cell" {
		t.Fatalf("no cell report: %s", r.Text())
	}
	var result map[string]any
	found := false
	for _, o := range r.Outputs {
		if o.Type == "execute_result" {
			remarshalBytes(t, o.Content, &result)
			found = true
		}
	}
	if !found || result["data"].(map[string]any)["text/plain"] != "3" {
		t.Errorf("the cell's value should be its result: %v", r.Outputs)
	}
	var v struct{ T []float64 }
	s.probe("import json; print(json.dumps({'T': t.tolist()}))", &v)
	if len(v.T) != 3 {
		t.Errorf("the cell's variables are not in the namespace: %v", v)
	}
	r = s.cell("%%gpumem\n1/0", true)
	if !strings.Contains(r.Text(), "ZeroDivisionError") || strings.Contains(r.Text(), "gpumem_magics") {
		t.Errorf("a failing cell under %%%%gpumem: %s", r.Text())
	}
}

// TestFreeAllKeep: --all (with --all-devices, on CPU) deletes every variable
// holding tensors except --keep, and nothing else; --keep without --all and
// an unknown --keep are refused.
func TestFreeAllKeep(t *testing.T) {
	s := torchSession(t)
	s.cell("import torch, json\nk = torch.ones(3)\nm = torch.nn.Linear(2, 2)\nlst = [torch.zeros(4), 'x']\nn = 5\ntxt = 'hello'", true)
	_, text := s.magic("%gpumem free --keep k")
	if !strings.Contains(text, "--keep only makes sense with --all") {
		t.Errorf("--keep without --all:\n%s", text)
	}
	_, text = s.magic("%gpumem free --all --keep nope")
	if !strings.Contains(text, "--keep names no variable: nope") {
		t.Errorf("unknown --keep:\n%s", text)
	}
	data, text := s.magic("%gpumem free --all --all-devices --keep k")
	var fr magics.FreeReport
	remarshal(t, data, &fr)
	var names []string
	for _, d := range fr.Deleted {
		names = append(names, d.Name)
	}
	if strings.Join(names, ",") != "m,lst" {
		t.Errorf("deleted %v, want m, lst:\n%s", names, text)
	}
	var left struct{ Names []string }
	s.probe("print(json.dumps({'Names': sorted(k for k in get_ipython().user_ns if not k.startswith('_') and k not in ('In', 'Out', 'exit', 'quit', 'get_ipython') and not "+testenv.KernelOwnNames+")}))", &left)
	if strings.Join(left.Names, ",") != "json,k,n,torch,txt" {
		t.Errorf("left: %v", left.Names)
	}
}
