// Package snapshot owns gpumem's reading of PyTorch CUDA memory snapshots
// (the pickles torch.cuda.memory._dump_snapshot writes, which
// pytorch.org/memory_viz opens): it reduces one, streamed, to a bounded
// summary the JupyterLab panel draws: per device the segments and their
// blocks, the allocation stacks holding the most bytes, the allocator's
// out-of-memory errors and a downsampled timeline of allocated and
// reserved memory. It does no I/O but reading the io.Reader it is given,
// and it never runs what a pickle names (see pickle.go).
package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"
)

// Bounds of a reduction: what the panel draws stays small whatever the
// snapshot's size.
const (
	MaxTimelinePoints = 2000 // per device, min and max of each bucket
	MaxSegments       = 2000 // listed per device (the totals count all)
	MaxBlocks         = 20000
	MaxTopStacks      = 20
	MaxStackFrames    = 24
	MaxOOMs           = 10
	// MaxDevices bounds the devices a snapshot may name (torch numbers a
	// host's GPUs from 0).
	MaxDevices = 64
	// MaxActions bounds the distinct trace actions counted by name (torch
	// has a dozen); the rest count as "other".
	MaxActions = 32
	// MaxString bounds each file or function name the reduction carries.
	MaxString = 512
)

// Reduction is a snapshot reduced for the panel. Its JSON is the panel's
// input; Schema changes when its meaning does.
type Reduction struct {
	Schema  int      `json:"schema"`
	Devices []Device `json:"devices"`
	// Stacks are the allocation stacks the devices refer to, by ID.
	Stacks []Stack `json:"stacks"`
	// ExpandableSegments is the allocator's setting, when the snapshot says.
	ExpandableSegments *bool `json:"expandable_segments,omitempty"`
	// InputBytes is how much pickle was read; Seconds how long it took;
	// PeakBytes the most the reader held meanwhile, as it estimates it
	// (Limits.Bytes bounds it).
	InputBytes int64   `json:"input_bytes"`
	PeakBytes  int64   `json:"peak_bytes"`
	Seconds    float64 `json:"seconds"`
}

// Device is one GPU's part of the snapshot.
type Device struct {
	Device   int      `json:"device"`
	Segments Segments `json:"segments"`
	// TopStacks are the stacks that allocated the memory live at the
	// snapshot, most bytes first (from the blocks; from the trace when the
	// blocks carry no stacks).
	TopStacks []StackBytes `json:"top_stacks"`
	// TraceTopStacks rank the stacks by all the bytes they allocated over
	// the trace.
	TraceTopStacks []StackBytes   `json:"trace_top_stacks"`
	OOMs           []OOM          `json:"ooms"`
	Timeline       Timeline       `json:"timeline"`
	Entries        int            `json:"entries"` // trace entries read
	Actions        map[string]int `json:"actions"`
}

// Segments are the device's cudaMalloc'd segments: totals over all, and
// the first MaxSegments largest with their blocks.
type Segments struct {
	Count          int       `json:"count"`
	ReservedBytes  uint64    `json:"reserved_bytes"`
	AllocatedBytes uint64    `json:"allocated_bytes"`
	ActiveBytes    uint64    `json:"active_bytes"`
	InactiveBytes  uint64    `json:"inactive_bytes"` // cached, free for reuse
	List           []Segment `json:"list"`
	Truncated      bool      `json:"truncated,omitempty"`
}

// Segment is one segment and its blocks in address order.
type Segment struct {
	Address        uint64  `json:"address"`
	TotalBytes     uint64  `json:"total_bytes"`
	AllocatedBytes uint64  `json:"allocated_bytes"`
	Type           string  `json:"type"` // "large" or "small"
	Stream         uint64  `json:"stream"`
	Blocks         []Block `json:"blocks"`
}

// Block is a piece of a segment: State "a" (active, allocated), "p" (freed,
// pending on another stream) or "i" (inactive: cached and free).
type Block struct {
	Offset uint64 `json:"offset"`
	Bytes  uint64 `json:"bytes"`
	State  string `json:"state"`
}

// StackBytes is one stack's share.
type StackBytes struct {
	Stack int    `json:"stack"`
	Bytes uint64 `json:"bytes"`
	Count int    `json:"count"`
}

// OOM is an out-of-memory error the allocator recorded.
type OOM struct {
	TimeUS          int64  `json:"time_us"`
	RequestedBytes  uint64 `json:"requested_bytes"`
	DeviceFreeBytes uint64 `json:"device_free_bytes"`
	Stack           int    `json:"stack"` // -1 without a stack
}

// Timeline is allocated and reserved bytes over the trace, downsampled:
// each bucket of entries gives its minimum and maximum, in time order.
type Timeline struct {
	TimeUS    []int64  `json:"time_us"`
	Allocated []uint64 `json:"allocated"`
	Reserved  []uint64 `json:"reserved"`
}

// Stack is one allocation stack, innermost frame first: its Python frames
// (C++ ones left out), at most MaxStackFrames, and Where, the first frame
// outside torch itself (the line that asked).
type Stack struct {
	ID          int     `json:"id"`
	Frames      []Frame `json:"frames"`
	FramesTotal int     `json:"frames_total"`
	Where       *Frame  `json:"where,omitempty"`
}

// Frame is one frame of a stack.
type Frame struct {
	Filename string `json:"filename"`
	Line     int64  `json:"line"`
	Name     string `json:"name"`
}

// ErrNotSnapshot is wrapped by Reduce's error for a pickle that is not a
// PyTorch memory snapshot.
var ErrNotSnapshot = errors.New("not a PyTorch memory snapshot")

// Reduce reads a snapshot pickle from r and reduces it within limits;
// it stops soon after ctx ends.
func Reduce(ctx context.Context, r io.Reader, limits Limits) (*Reduction, error) {
	start := time.Now()
	dec := NewDecoder(r, limits)
	red := newReducer(dec)
	dec.OnAppend = red.offer
	top, err := dec.Decode(ctx)
	if err != nil {
		return nil, err
	}
	dec.stack, dec.memo = nil, nil // what finish reads is reached from top
	out, err := red.finish(top)
	if err != nil {
		return nil, err
	}
	out.InputBytes, out.PeakBytes, out.Seconds = dec.Offset(), max(dec.m.peak, dec.m.held), time.Since(start).Seconds()
	return out, nil
}

// stackRef stands for a frames list already interned as stack n. The memo
// holds pointers into the reducer's table of them (an int in an interface
// would cost an allocation per entry).
type stackRef int

// reducer accumulates the trace entries as the decoder reads them.
type reducer struct {
	dec      *Decoder
	m        *meter
	frameTab []*Dict // frame id -> its dict (whose tag is id + 1)
	stacks   *stackTable
	refs     []*stackRef      // stack id -> the value standing for it in the memo
	ids      []int32          // scratch: the frame ids of the stack being interned
	traces   map[*List]*trace // per device list, until its index is known
}

func newReducer(dec *Decoder) *reducer {
	return &reducer{dec: dec, m: dec.m, stacks: newStackTable(), traces: map[*List]*trace{}}
}

// ref is the shared value that stands for stack id (-1: none).
func (rd *reducer) ref(id int) *stackRef {
	if id < 0 {
		none := stackRef(-1)
		return &none
	}
	for len(rd.refs) <= id {
		r := stackRef(len(rd.refs))
		rd.refs = append(rd.refs, &r)
	}
	return rd.refs[id]
}

// Costs of the reducer's own tables in the memory estimate.
const (
	traceCost = 2048 // a device's trace: its maps and timeline
	liveCost  = 64   // one live allocation of a trace
	frameCost = 16   // a frame's place in the frame table
	stackCost = 96   // a stack's entry in the tables, beside 8 bytes a frame
)

// offer sees the dicts appended to any list. Those with "frames" (trace
// entries, segments, blocks) get their frames list interned as a stack,
// which then stands in for the list everywhere; trace entries (with an
// "action") are consumed: tallied, then forgotten.
func (rd *reducer) offer(l *List, items []any) (bool, error) {
	if len(items) == 0 {
		return false, nil
	}
	first, ok := items[0].(*Dict)
	if !ok {
		return false, nil
	}
	_, isTrace := rd.get(first, "action")
	if _, hasFrames := rd.get(first, "frames"); !isTrace && !hasFrames {
		return false, rd.m.step(1)
	}
	var tr *trace
	if isTrace {
		if tr = rd.traces[l]; tr == nil {
			if err := rd.m.alloc(traceCost, "a device trace"); err != nil {
				return false, err
			}
			tr = newTrace()
			rd.traces[l] = tr
		}
	}
	for _, it := range items {
		e, ok := it.(*Dict)
		if !ok {
			continue
		}
		stack := -1
		if i := e.index("frames"); i >= 0 {
			var err error
			if stack, err = rd.intern(e.Vals[i]); err != nil {
				return false, err
			}
			e.Vals[i] = rd.ref(stack)
		}
		if err := rd.m.step(int64(len(e.Keys)) + 1); err != nil {
			return false, err
		}
		if isTrace {
			if err := tr.add(rd, e, stack); err != nil {
				return false, err
			}
			rd.dec.Forget(e)
		}
	}
	return isTrace, nil
}

// intern is the stack id of a frames value (a list of frame dicts, or one
// interned before); -1 for none.
func (rd *reducer) intern(v any) (int, error) {
	switch f := v.(type) {
	case *stackRef:
		return int(*f), nil
	case *List:
		if f.replaced { // interned already, met again through the memo
			if ref, ok := rd.dec.memoValue(f).(*stackRef); ok {
				return int(*ref), nil
			}
			return -1, nil
		}
		if err := rd.m.step(int64(len(f.Items)) + 1); err != nil {
			return -1, err
		}
		ids := rd.ids[:0]
		for _, it := range f.Items {
			fd, ok := it.(*Dict)
			if !ok {
				continue
			}
			if fd.tag == 0 {
				if err := rd.m.alloc(frameCost, "the frame table"); err != nil {
					return -1, err
				}
				rd.frameTab = append(rd.frameTab, fd)
				fd.tag = int32(len(rd.frameTab))
			}
			ids = append(ids, fd.tag-1)
		}
		rd.ids = ids
		id := -1
		if len(ids) > 0 {
			var isNew bool
			if id, isNew = rd.stacks.intern(ids); isNew {
				if err := rd.m.alloc(stackCost+8*int64(len(ids)), "the stack table"); err != nil {
					return -1, err
				}
			}
		}
		rd.dec.Replace(f, rd.ref(id))
		return id, nil
	}
	return -1, nil
}

// get is d.Get, its keys' comparisons counted as work.
func (rd *reducer) get(d *Dict, k string) (any, bool) {
	i := d.index(k)
	if i < 0 {
		rd.m.count(int64(len(d.Keys)))
		return nil, false
	}
	rd.m.count(int64(i))
	return d.Vals[i], true
}

// finish reads the top-level dict: segments, the device traces (by now
// consumed: only their identity orders them), the allocator settings.
func (rd *reducer) finish(top any) (*Reduction, error) {
	root, ok := top.(*Dict)
	if !ok {
		return nil, fmt.Errorf("%w: the pickle holds a %s, not a dict", ErrNotSnapshot, typeName(top))
	}
	segsV, ok := rd.get(root, "segments")
	if !ok {
		return nil, fmt.Errorf("%w: the dict has no \"segments\"", ErrNotSnapshot)
	}
	segs, ok := segsV.(*List)
	if !ok {
		return nil, fmt.Errorf("%w: \"segments\" is a %s, not a list", ErrNotSnapshot, typeName(segsV))
	}
	out := &Reduction{Schema: 1, Devices: []Device{}, Stacks: []Stack{}}
	devs := map[int]*deviceAcc{}
	dev := func(i int) (*deviceAcc, error) {
		if devs[i] == nil {
			if len(devs) >= MaxDevices {
				return nil, fmt.Errorf("more than %d devices (device %d): %w", MaxDevices, i, ErrLimit)
			}
			devs[i] = &deviceAcc{Device: Device{Device: i, Actions: map[string]int{}}, live: map[int]*StackBytes{}}
		}
		return devs[i], nil
	}
	for _, sv := range segs.Items {
		s, ok := sv.(*Dict)
		if !ok {
			return nil, fmt.Errorf("%w: a segment is a %s, not a dict", ErrNotSnapshot, typeName(sv))
		}
		d, err := dev(int(rd.int(s, "device")))
		if err == nil {
			err = d.addSegment(rd, s)
		}
		if err == nil {
			err = rd.m.step(1)
		}
		if err != nil {
			return nil, err
		}
	}
	if tv, ok := rd.get(root, "device_traces"); ok {
		traces, ok := tv.(*List)
		if !ok {
			return nil, fmt.Errorf("%w: \"device_traces\" is a %s, not a list", ErrNotSnapshot, typeName(tv))
		}
		for i, lv := range traces.Items {
			l, ok := lv.(*List)
			if !ok {
				continue
			}
			d, err := dev(i)
			if err != nil {
				return nil, err
			}
			d.tr = rd.traces[l]
		}
	}
	if sv, ok := rd.get(root, "allocator_settings"); ok {
		if s, ok := sv.(*Dict); ok {
			if v, ok := rd.get(s, "expandable_segments"); ok {
				if b, ok := v.(bool); ok {
					out.ExpandableSegments = &b
				}
			}
		}
	}
	return out, rd.finishDevices(out, devs)
}

// finishDevices ranks and bounds each device's part, in device order, and
// renders the stacks they name.
func (rd *reducer) finishDevices(out *Reduction, devs map[int]*deviceAcc) error {
	idx := make([]int, 0, len(devs))
	for i := range devs {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	used := map[int]bool{}
	for _, i := range idx {
		d, err := devs[i].finish(rd.m)
		if err != nil {
			return err
		}
		for _, lists := range [][]StackBytes{d.TopStacks, d.TraceTopStacks} {
			for _, s := range lists {
				used[s.Stack] = true
			}
		}
		for _, o := range d.OOMs {
			if o.Stack >= 0 {
				used[o.Stack] = true
			}
		}
		out.Devices = append(out.Devices, d)
	}
	ids := make([]int, 0, len(used))
	for id := range used {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		st, err := rd.stack(id)
		if err != nil {
			return err
		}
		out.Stacks = append(out.Stacks, st)
	}
	return nil
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case *List:
		return "list"
	case *Dict:
		return "dict"
	case Tuple:
		return "tuple"
	case string:
		return "str"
	case int64:
		return "int"
	case float64:
		return "float"
	case bool:
		return "bool"
	case []byte:
		return "bytes"
	}
	return fmt.Sprintf("%T", v)
}

// int is d's integer value of key k (0 if none), the lookup counted.
func (rd *reducer) int(d *Dict, k string) int64 {
	v, _ := rd.get(d, k)
	switch x := v.(type) {
	case int64:
		return x
	case float64:
		return int64(x)
	case bool:
		if x {
			return 1
		}
	}
	return 0
}

func (rd *reducer) uint(d *Dict, k string) uint64 {
	if v := rd.int(d, k); v > 0 {
		return uint64(v)
	}
	return 0
}

func (rd *reducer) str(d *Dict, k string) string {
	v, _ := rd.get(d, k)
	s, _ := v.(string)
	return s
}
