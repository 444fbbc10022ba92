package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"

	"github.com/gpumem/gpumem/internal/testenv"
)

// pyPickle runs Python code that writes a pickle to sys.stdout.buffer and
// returns it: pickles made by CPython's own pickler.
func pyPickle(t testing.TB, code string) []byte {
	t.Helper()
	cmd := exec.Command(testenv.Python(), "-c", "import pickle, sys\n"+code)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	return out
}

// synth writes scripts/synth_snapshot.py's snapshot of n entries.
func synth(t testing.TB, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), fmt.Sprintf("synth-%d.pickle", n))
	cmd := exec.Command(testenv.Python(), filepath.Join(testenv.RepoRoot(), "scripts", "synth_snapshot.py"), path, fmt.Sprint(n))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("synth_snapshot.py: %v\n%s", err, out)
	}
	return path
}

func reduceFile(t testing.TB, path string) *Reduction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	red, err := Reduce(context.Background(), f, DefaultLimits)
	if err != nil {
		t.Fatalf("reduce %s: %v", path, err)
	}
	return red
}

func TestReduceSynthetic(t *testing.T) {
	const n = 20000
	red := reduceFile(t, synth(t, n))
	if len(red.Devices) != 1 {
		t.Fatalf("devices: %+v", red.Devices)
	}
	d := red.Devices[0]
	if d.Entries != n || d.Actions["oom"] != 1 || d.Actions["segment_alloc"] != 1 || d.Actions["alloc"] == 0 ||
		d.Actions["free_requested"]-d.Actions["free_completed"] > 1 {
		t.Errorf("entries %d actions %v", d.Entries, d.Actions)
	}
	stacks := map[int]Stack{}
	for _, s := range red.Stacks {
		stacks[s.ID] = s
	}
	where := func(id int) string {
		s, ok := stacks[id]
		if !ok || s.Where == nil {
			return "?"
		}
		return fmt.Sprintf("%s:%d", s.Where.Filename, s.Where.Line)
	}
	const marker = "/tmp/ipykernel_1/marker.py:42"
	// Live blocks: one 4 MiB block of the marker's in each of 64 segments.
	if len(d.TopStacks) == 0 || where(d.TopStacks[0].Stack) != marker || d.TopStacks[0].Bytes != 64*(4<<20) || d.TopStacks[0].Count != 64 {
		t.Errorf("top stack: %+v at %s", d.TopStacks, where(d.TopStacks[0].Stack))
	}
	if len(d.TraceTopStacks) == 0 || where(d.TraceTopStacks[0].Stack) != marker || d.TraceTopStacks[0].Count == 0 ||
		d.TraceTopStacks[0].Bytes != uint64(d.TraceTopStacks[0].Count)*(256<<20) {
		t.Errorf("trace top stack: %+v", d.TraceTopStacks)
	}
	if len(d.OOMs) != 1 || d.OOMs[0].RequestedBytes != 20<<30 || d.OOMs[0].DeviceFreeBytes != 1<<20 || where(d.OOMs[0].Stack) != marker {
		t.Errorf("ooms: %+v", d.OOMs)
	}
	s := stacks[d.TopStacks[0].Stack]
	// C++ frames are left out; torch's own frame is kept but is not "where".
	if s.FramesTotal != 10 || len(s.Frames) != 8 || s.Frames[0].Filename != "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py" {
		t.Errorf("marker stack: %+v", s)
	}
	if d.Segments.Count != 64 || d.Segments.ReservedBytes != 64*(64<<20) || len(d.Segments.List) != 64 || len(d.Segments.List[0].Blocks) != 16 ||
		d.Segments.List[0].Blocks[1] != (Block{Offset: 4 << 20, Bytes: 4 << 20, State: "a"}) {
		t.Errorf("segments: count %d reserved %d", d.Segments.Count, d.Segments.ReservedBytes)
	}
	tl := d.Timeline
	if len(tl.TimeUS) == 0 || len(tl.TimeUS) > MaxTimelinePoints || len(tl.Allocated) != len(tl.TimeUS) || len(tl.Reserved) != len(tl.TimeUS) {
		t.Fatalf("timeline: %d points", len(tl.TimeUS))
	}
	if !sort.SliceIsSorted(tl.TimeUS, func(i, j int) bool { return tl.TimeUS[i] < tl.TimeUS[j] }) {
		t.Error("timeline not in time order")
	}
	// It ends at the snapshot's own figures.
	if last := tl.Allocated[len(tl.Allocated)-1]; last != d.Segments.AllocatedBytes {
		t.Errorf("timeline ends at %d allocated, the segments say %d", last, d.Segments.AllocatedBytes)
	}
	if red.ExpandableSegments == nil || *red.ExpandableSegments {
		t.Errorf("expandable_segments: %v", red.ExpandableSegments)
	}
}

// TestReduceBounded: a reduction stays small whatever the trace's length.
func TestReduceBounded(t *testing.T) {
	small, big := reduceFile(t, synth(t, 2000)), reduceFile(t, synth(t, 60000))
	bs, _ := json.Marshal(small)
	bb, _ := json.Marshal(big)
	if len(big.Devices[0].Timeline.TimeUS) > MaxTimelinePoints || len(bb) > 2*len(bs)+200_000 {
		t.Errorf("2,000 entries reduce to %d bytes, 60,000 to %d (%d points)", len(bs), len(bb), len(big.Devices[0].Timeline.TimeUS))
	}
}

// TestDecodeMatchesGopickle: the reader gives what a general pickle
// library gives, for CPython's pickles of every protocol it reads.
func TestDecodeMatchesGopickle(t *testing.T) {
	for proto := 2; proto <= 5; proto++ {
		raw := pyPickle(t, fmt.Sprintf(`shared = {"filename": "a.py", "line": 3, "name": "f"}
big = [{"i": i, "s": "x" * (i %% 300), "f": shared} for i in range(3000)]
v = {"a": [1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**63 - 1, -2**63, 2**64, 2**100, -2**70],
     "b": (0, 0), "c": (1,), "d": (1, 2, 3), "e": (1, 2, 3, 4), "f": 1.5, "g": True, "h": False, "i": None,
     "j": b"raw" * 100 if %d >= 3 else "bytes need protocol 3", "k": "é" * 70000, "l": [shared, shared], "m": big, "n": {}, "o": [], "p": ()}
sys.stdout.buffer.write(pickle.dumps(v, protocol=%d))`, proto, proto))
		got, err := NewDecoder(bytes.NewReader(raw), DefaultLimits).Decode(context.Background())
		if err != nil {
			t.Fatalf("protocol %d: %v", proto, err)
		}
		u := pickle.NewUnpickler(bytes.NewReader(raw))
		ref, err := u.Load()
		if err != nil {
			t.Fatalf("gopickle, protocol %d: %v", proto, err)
		}
		if g, w := plain(got), plainRef(ref); !reflect.DeepEqual(g, w) {
			gj, _ := json.Marshal(g)
			wj, _ := json.Marshal(w)
			t.Errorf("protocol %d:\n got %.600s\nwant %.600s", proto, gj, wj)
		}
	}
}

// plain and plainRef turn both decoders' values into the same Go values.
func plain(v any) any {
	switch x := v.(type) {
	case *List:
		out := []any{}
		for _, it := range x.Items {
			out = append(out, plain(it))
		}
		return out
	case Tuple:
		out := []any{"tuple"}
		for _, it := range x {
			out = append(out, plain(it))
		}
		return out
	case *Dict:
		out := map[string]any{}
		for i, k := range x.Keys {
			out[fmt.Sprint(plain(k))] = plain(x.Vals[i])
		}
		return out
	case []byte:
		return "bytes:" + string(x)
	case int64:
		return big.NewInt(x).String()
	case float64:
		if x > 1<<62 || x < -(1<<62) { // an integer past int64: approximate
			f, _ := big.NewFloat(x).Int(nil)
			return "~" + f.String()[:6]
		}
		return x
	}
	return v
}

func plainRef(v any) any {
	switch x := v.(type) {
	case *types.List:
		out := []any{}
		for _, it := range *x {
			out = append(out, plainRef(it))
		}
		return out
	case *types.Tuple:
		out := []any{"tuple"}
		for _, it := range *x {
			out = append(out, plainRef(it))
		}
		return out
	case *types.Dict:
		out := map[string]any{}
		for _, e := range *x {
			out[fmt.Sprint(plainRef(e.Key))] = plainRef(e.Value)
		}
		return out
	case []byte:
		return "bytes:" + string(x)
	case int:
		return big.NewInt(int64(x)).String()
	case *big.Int:
		if x.IsInt64() {
			return x.String()
		}
		return "~" + x.String()[:6]
	case bool, string, float64, nil:
		return x
	}
	return fmt.Sprintf("%T %v", v, v)
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name string
		raw  []byte
		is   error
		has  string
	}{
		{"a class instance", pyPickle(t, `import datetime; sys.stdout.buffer.write(pickle.dumps({"segments": [datetime.date(2020, 1, 1)]}))`), nil, "not plain data"},
		{"an object to build", pyPickle(t, `import collections; sys.stdout.buffer.write(pickle.dumps(collections.OrderedDict(a=1)))`), nil, "not plain data"},
		{"protocol 0", pyPickle(t, `sys.stdout.buffer.write(pickle.dumps({"a": 1}, protocol=0))`), nil, "not plain data"},
		{"protocol 1 header-less", []byte("}q\x00."), nil, ""},
		{"truncated", pyPickle(t, `sys.stdout.buffer.write(pickle.dumps({"segments": list(range(1000))})[:-40])`), nil, "truncated"},
		{"empty", nil, nil, "truncated"},
		{"a memo slot never stored", []byte("\x80\x04h\x05."), nil, "never stored"},
		{"STOP on an empty stack", []byte("\x80\x04."), nil, "STOP at byte 2 with 0 values"},
		{"APPENDS to a dict", []byte("\x80\x04}(K\x01e."), nil, "not a list"},
		{"odd SETITEMS", []byte("\x80\x04}(K\x01u."), nil, "odd number"},
		{"a huge string", []byte("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\x7f"), ErrLimit, "a string of"},
		{"too many memo slots", []byte("\x80\x04N\x94" + strings.Repeat("\x94", 40) + "."), ErrLimit, "memo slot"},
	}
	limits := DefaultLimits
	limits.MemoSlots = 16
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewDecoder(bytes.NewReader(c.raw), limits).Decode(context.Background())
			if err == nil {
				if c.has == "" {
					return // protocol 1's opcodes without PROTO are data too
				}
				t.Fatal("no error")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.has) {
				t.Errorf("error %q lacks %q", err, c.has)
			}
		})
	}
}

func TestReduceNotASnapshot(t *testing.T) {
	for name, code := range map[string]string{
		"a list":             `[1, 2]`,
		"no segments":        `{"device_traces": []}`,
		"segments not list":  `{"segments": 3}`,
		"a segment not dict": `{"segments": [1]}`,
		"traces not a list":  `{"segments": [], "device_traces": "x"}`,
	} {
		raw := pyPickle(t, "sys.stdout.buffer.write(pickle.dumps("+code+"))")
		if _, err := Reduce(context.Background(), bytes.NewReader(raw), DefaultLimits); !errors.Is(err, ErrNotSnapshot) {
			t.Errorf("%s: %v, want ErrNotSnapshot", name, err)
		}
	}
	// An empty snapshot (recording off, nothing allocated) is one.
	raw := pyPickle(t, `sys.stdout.buffer.write(pickle.dumps({"segments": [], "device_traces": [[]]}))`)
	red, err := Reduce(context.Background(), bytes.NewReader(raw), DefaultLimits)
	if err != nil || len(red.Devices) != 1 || red.Devices[0].Entries != 0 {
		t.Errorf("empty snapshot: %+v %v", red, err)
	}
}
