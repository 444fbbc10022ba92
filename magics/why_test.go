package magics_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/magics"
)

// sevenHolders plants, in a notebook, a CPU tensor in each of seven holders
// that no variable shows (each of its own size, float32 elements), and
// weak references to them in _refs. The traceback is a cell of its own
// (failCell), as a notebook keeps it.
const sevenHolders = `import functools, gc, sys, threading, types, weakref
import torch

def make():
    w = torch.zeros(1001)
    return lambda: w
f = make()

@functools.lru_cache(maxsize=8)
def load(n):
    return torch.zeros(n)
load(1002)

stash = types.ModuleType("gpumem_test_stash")
sys.modules["gpumem_test_stash"] = stash
stash.T = torch.zeros(1003)
del stash

model = torch.nn.Linear(2, 2)
def mk(t):
    return lambda mod, inp, out: t
h = model.register_forward_hook(mk(torch.zeros(1004)))

ev, ready = threading.Event(), threading.Event()
_refs = {}
def worker():
    t = torch.zeros(1005)
    _refs[1005] = weakref.ref(t)
    ready.set()
    ev.wait(120)
th = threading.Thread(target=worker, name="stash-worker", daemon=True)
th.start()
ready.wait(10)

class Node(object):
    pass
n = Node(); n.me = n; n.t = torch.zeros(1006)
_refs[1006] = weakref.ref(n.t)
del n

_refs[1001] = weakref.ref(f.__closure__[0].cell_contents)
_refs[1002] = weakref.ref(load(1002))
_refs[1003] = weakref.ref(sys.modules["gpumem_test_stash"].T)
_refs[1004] = weakref.ref(model._forward_hooks[h.id].__closure__[0].cell_contents)

def fail():
    big = torch.zeros(1007)
    _refs[1007] = weakref.ref(big)
    1 / 0
gc.freeze()`

const failCell = "fail()"

// gcAndNamespace prints gc's state and the notebook's names.
const gcAndNamespace = `import gc as _gc, json as _json, sys as _sys
print(_json.dumps({"gc": [_gc.isenabled(), list(_gc.get_threshold()), _gc.get_debug(), _gc.get_freeze_count()],
    "names": sorted(k for k in globals() if not k.startswith("_")),
    "last": repr(_sys.__dict__.get("last_value")), "out": sorted(Out)}))`

type whyRow struct {
	Category string   `json:"category"`
	Name     string   `json:"name"`
	Bytes    int64    `json:"bytes"`
	Hops     int      `json:"hops"`
	Chain    []string `json:"chain"`
	Holder   string   `json:"holder"`
	Root     string   `json:"root"`
	Fix      string   `json:"fix"`
}

type whyData struct {
	Kind    string         `json:"kind"`
	Rows    []whyRow       `json:"rows"`
	Stopped map[string]any `json:"stopped"`
	Elapsed int            `json:"elapsed_ms"`
}

type kernelLook struct {
	GC    []any    `json:"gc"`
	Names []string `json:"names"`
	Last  string   `json:"last"`
	Out   []int    `json:"out"`
}

// TestWhySevenHolders: in a real kernel, %gpumem why --all-devices names
// each of the seven holders with a chain of at most six hops; it leaves
// the namespace, Out, sys.last_value and gc's state (thresholds, debug
// flags, frozen objects) as they were; and applying the fixes it printed
// frees every tensor (weak references die), so it kept none itself.
func TestWhySevenHolders(t *testing.T) {
	s := torchSession(t)
	s.cell(sevenHolders, true)
	if r := s.cell(failCell, false); r.Status() != "error" {
		t.Fatalf("the failing cell did not fail: %s", r.Text())
	}
	var before, after kernelLook
	s.probe(gcAndNamespace, &before)
	raw, text := s.magic("%gpumem why --all-devices --budget 20")
	s.probe(gcAndNamespace, &after)
	// The probe itself runs as cells: compare what why could change. The
	// frozen objects' count may fall between the probes: gc.freeze() froze
	// whatever the kernel's other threads held at that instant, and those
	// die when their threads let go. It never rises (why froze nothing)
	// and never reaches 0 (why unfroze nothing).
	frozen := func(l kernelLook) float64 {
		if len(l.GC) < 4 {
			return -1
		}
		n, _ := l.GC[3].(float64)
		return n
	}
	if frozen(before) <= 0 || frozen(after) <= 0 || frozen(after) > frozen(before) || !reflect.DeepEqual(before.GC[:3], after.GC[:3]) ||
		!reflect.DeepEqual(before.Names, after.Names) || before.Last != after.Last || !reflect.DeepEqual(before.Out, after.Out) {
		t.Errorf("why changed the kernel:\nbefore %+v\nafter  %+v", before, after)
	}
	var d whyData
	remarshal(t, raw, &d)
	holders := map[int]string{1001: "a closure cell", 1002: "a functools cache", 1003: "a module attribute",
		1004: "a hook registry", 1005: "a live thread's frame", 1006: "gc.freeze()'s permanent generation"}
	found := map[int]whyRow{}
	for _, r := range d.Rows {
		for n := range 7 {
			if r.Bytes == int64(4*(1001+n)) {
				found[1001+n] = r
			}
		}
	}
	if len(found) != 7 {
		// The data (what the frozen walk read, where a search stopped) says
		// which step missed them.
		js, _ := json.Marshal(raw)
		t.Fatalf("why named %d of the 7 holders:\n%s\ndata: %s", len(found), text, js)
	}
	for n, r := range found {
		if r.Hops < 1 || r.Hops > 6 || len(r.Chain) != r.Hops || r.Fix == "" {
			t.Errorf("holder %d: chain of %d hops %q, fix %q", n, r.Hops, r.Chain, r.Fix)
		}
		if want, ok := holders[n]; ok && r.Holder != want {
			t.Errorf("holder %d is %q, want %q: %+v", n, r.Holder, want, r)
		}
	}
	if r := found[1007]; r.Category != "hidden" || !strings.Contains(r.Name, "traceback") {
		t.Errorf("the traceback: %+v", r)
	}
	// The fixes, as printed; the thread's is to end it.
	var fixes []string
	for n, r := range found {
		if n != 1005 {
			fixes = append(fixes, r.Fix)
		}
	}
	s.cell(strings.Join(fixes, "\n")+"\nev.set(); th.join(10)", true)
	var alive []int
	s.probe(`import gc as _gc, json as _json
_gc.collect()
print(_json.dumps(sorted(k for k, r in _refs.items() if r() is not None)))`, &alive)
	if len(alive) != 0 {
		t.Errorf("tensors still alive after the printed fixes %q: %v", fixes, alive)
	}
	// Once freed, why finds none of them.
	raw, text = s.magic("%gpumem why --all-devices --budget 20")
	remarshal(t, raw, &d)
	for _, r := range d.Rows {
		if r.Bytes >= 4*1001 && r.Bytes <= 4*1007 {
			t.Errorf("a holder is left after its fix: %+v\n%s", r, text)
		}
	}
}

// TestWhyAPISilent: magics.Why reads the same data by a silent execute:
// nothing shown, execution_count unchanged; Render renders it.
func TestWhyAPISilent(t *testing.T) {
	s := torchSession(t)
	s.cell("import torch, functools\n@functools.lru_cache\ndef cached():\n    return torch.zeros(2000)\nx = cached(); del x", true)
	before := s.cell("1", true).ExecutionCount()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	raw, err := magics.Why(ctx, s.ex, magics.WhyOptions{AllDevices: true, Budget: 10})
	if err != nil {
		t.Fatal(err)
	}
	var d whyData
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	var row *whyRow
	for i := range d.Rows {
		if d.Rows[i].Bytes == 8000 {
			row = &d.Rows[i]
		}
	}
	if d.Kind != "why" || row == nil || row.Fix != "cached.cache_clear()" {
		t.Fatalf("why data: %s", raw)
	}
	rendered, err := magics.Render(ctx, s.ex, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Text string }
	if err := json.Unmarshal(rendered, &out); err != nil || !strings.Contains(out.Text, "cached.cache_clear()") {
		t.Errorf("rendered: %v %s", err, rendered)
	}
	if after := s.cell("1", true).ExecutionCount(); after != before+1 {
		t.Errorf("execution count %d -> %d: the silent requests counted", before, after)
	}
	// Bad arguments are an error naming the usage, not a traceback.
	data, text := s.magic("%gpumem why --device x")
	if data["kind"] != "error" || !strings.Contains(text, "usage: %gpumem why") {
		t.Errorf("bad argument: %v %s", data, text)
	}
}

// frozenHolders plants a 65 MiB CPU tensor in a variable, a 16 MiB one
// frozen by gc.freeze() with its holder (a cycle), and a 4 MiB one made
// after the freeze that only a frozen object holds.
const frozenHolders = `import gc, torch
class Holder(object):
    pass
a = torch.zeros(65 << 18)
h = Holder(); h.me = h; h.t = torch.zeros(16 << 18)
del h
late = Holder(); late.me = late
gc.freeze()
late.t = torch.zeros(4 << 18)
del late`

type whyFrozenData struct {
	Rows   []whyRow `json:"rows"`
	Frozen struct {
		Count int  `json:"count"`
		Read  bool `json:"read"`
	} `json:"frozen"`
	Unplaced *struct {
		Devices []struct {
			Device string `json:"device"`
			Bytes  int64  `json:"bytes"`
		} `json:"devices"`
		Why string `json:"why"`
	} `json:"unplaced"`
	Stopped map[string]any `json:"stopped"`
}

// TestWhyFrozenHolder: in a real kernel, %gpumem why --all-devices names
// the holders gc.freeze() froze where this Python's permanent generation
// can be read (CPython 3.11); made unreadable (as on 3.12 and later), it
// says so, with the bytes it could not place on the CPU, and never calls
// the holder "a holder in C". Either way nothing is left unsaid: the rows
// and the unplaced bytes account for every tensor found.
func TestWhyFrozenHolder(t *testing.T) {
	const mib = 1 << 20
	s := torchSession(t)
	s.cell(frozenHolders, true)
	var ver []int
	s.probe("import sys, json; print(json.dumps(list(sys.version_info[:2])))", &ver)
	raw, text := s.magic("%gpumem why --all-devices --budget 30")
	var d whyFrozenData
	remarshal(t, raw, &d)
	byBytes := map[int64]whyRow{}
	for _, r := range d.Rows {
		byBytes[r.Bytes] = r
	}
	if r := byBytes[65*mib]; r.Category != "variables" {
		t.Fatalf("the variable's row: %+v\n%s", r, text)
	}
	if d.Stopped != nil {
		t.Fatalf("why stopped within a 30 s budget: %v\n%s", d.Stopped, text)
	}
	if len(ver) == 2 && ver[0] == 3 && ver[1] == 11 {
		// Read: both frozen holders named, in one row (one root, one fix).
		r := byBytes[20*mib]
		if !d.Frozen.Read || r.Root != "gc.freeze()'s permanent generation" || r.Fix != "gc.unfreeze(); gc.collect()" || d.Unplaced != nil {
			t.Errorf("Python %v: the frozen holders are not named: frozen %+v, unplaced %+v\n%s", ver, d.Frozen, d.Unplaced, text)
		}
	} else if d.Frozen.Read || d.Unplaced == nil {
		t.Errorf("Python %v: frozen %+v, unplaced %+v: the frozen objects are not read, and why must say so\n%s", ver, d.Frozen, d.Unplaced, text)
	}

	// Unreadable, as on a Python whose list gpumem does not read.
	s.cell(`import sys as _s; _s.modules["_gpumem_magics"].frozen._LAYOUTS = ()`, true)
	raw, text = s.magic("%gpumem why --all-devices --budget 30")
	d = whyFrozenData{}
	remarshal(t, raw, &d)
	var late *whyRow
	for i := range d.Rows {
		switch r := d.Rows[i]; {
		case r.Bytes == 4*mib:
			late = &d.Rows[i]
		case r.Root == "a holder in C that gc cannot see into":
			t.Errorf("a frozen holder taken for a holder in C: %+v\n%s", r, text)
		}
	}
	if late == nil || late.Root != "gc.freeze()'s objects, not searched" {
		t.Errorf("the tensor only a frozen object holds: %+v\n%s", late, text)
	}
	cpu := int64(-1)
	if d.Unplaced != nil {
		for _, u := range d.Unplaced.Devices {
			if u.Device == "cpu" {
				cpu = u.Bytes
			}
		}
	}
	if d.Frozen.Read || cpu != 4*mib || !strings.Contains(d.Unplaced.Why, "gc.freeze() froze") ||
		!strings.Contains(text, "not placed: 4.0 MiB on cpu") {
		t.Errorf("unreadable frozen objects: frozen %+v, unplaced %+v (cpu %d bytes)\n%s", d.Frozen, d.Unplaced, cpu, text)
	}
}
