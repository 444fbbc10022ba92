package snapshot

import (
	"encoding/binary"
	"slices"
	"sort"
)

// trace tallies one device's trace entries as they are read.
type trace struct {
	entries  int
	actions  map[string]int
	alloc    int64 // running sums since the trace's first entry
	reserved int64
	live     map[uint64]liveAlloc // allocations not freed yet, by address
	byStack  map[int]*StackBytes  // all bytes allocated, per stack
	ooms     []OOM
	timeline downsampler
}

type liveAlloc struct {
	bytes uint64
	stack int
}

func newTrace() *trace {
	return &trace{actions: map[string]int{}, live: map[uint64]liveAlloc{}, byStack: map[int]*StackBytes{},
		timeline: downsampler{per: 1}}
}

func (t *trace) add(rd *reducer, e *Dict, stack int) error {
	action := rd.str(e, "action")
	size := rd.uint(e, "size")
	t.entries++
	if _, known := t.actions[action]; !known && len(t.actions) >= MaxActions {
		action = "other"
	}
	t.actions[action]++
	switch action {
	case "alloc":
		t.alloc += int64(size)
		addr := rd.uint(e, "addr")
		if _, ok := t.live[addr]; !ok {
			if err := rd.m.alloc(liveCost, "the live allocations"); err != nil {
				return err
			}
		}
		t.live[addr] = liveAlloc{size, stack}
		if stack >= 0 {
			sb := t.byStack[stack]
			if sb == nil {
				if err := rd.m.alloc(liveCost, "the stacks' tallies"); err != nil {
					return err
				}
				sb = &StackBytes{Stack: stack}
				t.byStack[stack] = sb
			}
			sb.Bytes += size
			sb.Count++
		}
	case "free_completed":
		t.alloc -= int64(size)
		addr := rd.uint(e, "addr")
		if _, ok := t.live[addr]; ok {
			delete(t.live, addr)
			rd.m.free(liveCost)
		}
	case "segment_alloc", "segment_map":
		t.reserved += int64(size)
	case "segment_free", "segment_unmap":
		t.reserved -= int64(size)
	case "oom":
		if len(t.ooms) < MaxOOMs {
			t.ooms = append(t.ooms, OOM{TimeUS: rd.int(e, "time_us"), RequestedBytes: size,
				DeviceFreeBytes: rd.uint(e, "device_free"), Stack: stack})
		}
	}
	t.timeline.add(rd.int(e, "time_us"), t.alloc, t.reserved)
	return nil
}

// downsampler keeps at most MaxTimelinePoints/2 buckets of `per` entries
// each, the minimum and maximum of each; when full, neighbours merge and
// buckets hold twice as many entries.
type downsampler struct {
	per     int
	buckets []bucket
	cur     bucket
	n       int // entries in cur
}

type bucket struct {
	set                    bool
	minT, maxT, minA, maxA int64
	minR, maxR             int64
}

func (b *bucket) add(t, a, r int64) {
	if !b.set {
		*b = bucket{set: true, minT: t, maxT: t, minA: a, maxA: a, minR: r, maxR: r}
		return
	}
	if a < b.minA {
		b.minT, b.minA = t, a
	}
	if a >= b.maxA {
		b.maxT, b.maxA = t, a
	}
	b.minR, b.maxR = min(b.minR, r), max(b.maxR, r)
}

func merge(x, y bucket) bucket {
	out := x
	if y.minA < x.minA {
		out.minT, out.minA = y.minT, y.minA
	}
	if y.maxA >= x.maxA {
		out.maxT, out.maxA = y.maxT, y.maxA
	}
	out.minR, out.maxR = min(x.minR, y.minR), max(x.maxR, y.maxR)
	return out
}

func (s *downsampler) add(t, a, r int64) {
	s.cur.add(t, a, r)
	if s.n++; s.n < s.per {
		return
	}
	s.buckets = append(s.buckets, s.cur)
	s.cur, s.n = bucket{}, 0
	if len(s.buckets) >= MaxTimelinePoints {
		s.halve()
	}
}

func (s *downsampler) halve() {
	half := s.buckets[:0]
	for i := 0; i+1 < len(s.buckets); i += 2 {
		half = append(half, merge(s.buckets[i], s.buckets[i+1]))
	}
	if len(s.buckets)%2 == 1 {
		half = append(half, s.buckets[len(s.buckets)-1])
	}
	s.buckets = half
	s.per *= 2
}

// points is the timeline, shifted so that it ends at the snapshot's own
// allocated and reserved figures (the trace may start after the allocator
// did: a ring buffer keeps the last entries only).
func (s *downsampler) points(endA, endR, runA, runR int64) Timeline {
	bs := slices.Clone(s.buckets)
	if s.n > 0 {
		bs = append(bs, s.cur)
	}
	for len(bs) > MaxTimelinePoints/2 {
		s.buckets, s.n = bs, 0
		s.halve()
		bs = s.buckets
	}
	offA, offR := endA-runA, endR-runR
	tl := Timeline{TimeUS: []int64{}, Allocated: []uint64{}, Reserved: []uint64{}}
	emit := func(t, a, r int64) {
		tl.TimeUS = append(tl.TimeUS, t)
		tl.Allocated = append(tl.Allocated, clampU(a+offA))
		tl.Reserved = append(tl.Reserved, clampU(r+offR))
	}
	for _, b := range bs {
		if b.minT <= b.maxT {
			emit(b.minT, b.minA, b.minR)
			if b.maxT != b.minT || b.maxA != b.minA {
				emit(b.maxT, b.maxA, b.maxR)
			}
		} else {
			emit(b.maxT, b.maxA, b.maxR)
			emit(b.minT, b.minA, b.minR)
		}
	}
	return tl
}

func clampU(v int64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

// stackTable interns stacks (sequences of frame ids), keyed by their
// ids' bytes: Go's map hashes with a seed of its own, so no pickle can
// make its stacks collide.
type stackTable struct {
	byKey  map[string]int
	stacks [][]int32
	key    []byte // scratch
}

func newStackTable() *stackTable {
	return &stackTable{byKey: map[string]int{}}
}

// intern is ids' stack id, and whether it is new; ids is copied when new.
func (st *stackTable) intern(ids []int32) (int, bool) {
	st.key = st.key[:0]
	for _, id := range ids {
		st.key = binary.LittleEndian.AppendUint32(st.key, uint32(id))
	}
	if id, ok := st.byKey[string(st.key)]; ok {
		return id, false
	}
	id := len(st.stacks)
	st.stacks = append(st.stacks, slices.Clone(ids))
	st.byKey[string(st.key)] = id
	return id, true
}

func (st *stackTable) get(id int) []int32 {
	if id < 0 || id >= len(st.stacks) {
		return nil
	}
	return st.stacks[id]
}

// deviceAcc gathers one device's segments and trace.
type deviceAcc struct {
	Device
	segs      []Segment
	live      map[int]*StackBytes // live blocks' bytes per stack
	withStack bool
	tr        *trace
}

// Costs of a segment and of a block copied into the reduction.
const (
	segmentCost = 160
	blockCost   = 48
)

func (d *deviceAcc) addSegment(rd *reducer, s *Dict) error {
	seg := Segment{Address: rd.uint(s, "address"), TotalBytes: rd.uint(s, "total_size"),
		AllocatedBytes: rd.uint(s, "allocated_size"), Type: clip(rd.str(s, "segment_type")), Stream: rd.uint(s, "stream")}
	d.Segments.Count++
	d.Segments.ReservedBytes += seg.TotalBytes
	d.Segments.AllocatedBytes += seg.AllocatedBytes
	d.Segments.ActiveBytes += rd.uint(s, "active_size")
	if err := rd.m.alloc(segmentCost, "the segments"); err != nil {
		return err
	}
	if bv, ok := rd.get(s, "blocks"); ok {
		if bl, ok := bv.(*List); ok {
			if err := rd.m.alloc(blockCost*int64(len(bl.Items)), "the segments' blocks"); err != nil {
				return err
			}
			for _, it := range bl.Items {
				if err := rd.m.step(1); err != nil {
					return err
				}
				if b, ok := it.(*Dict); ok {
					seg.Blocks = append(seg.Blocks, d.block(rd, seg.Address, b))
				}
			}
		}
	}
	if seg.Blocks == nil {
		seg.Blocks = []Block{}
	}
	d.segs = append(d.segs, seg)
	return nil
}

// block is b, a block of the segment at segAddr, tallied.
func (d *deviceAcc) block(rd *reducer, segAddr uint64, b *Dict) Block {
	blk := Block{Bytes: rd.uint(b, "size"), State: blockState(rd.str(b, "state"))}
	if a := rd.uint(b, "address"); a >= segAddr {
		blk.Offset = a - segAddr
	}
	switch blk.State {
	case "a":
		stack := -1
		if v, ok := rd.get(b, "frames"); ok {
			if ref, ok := v.(*stackRef); ok {
				stack = int(*ref)
			}
		}
		if stack >= 0 {
			d.withStack = true
			sb := d.live[stack]
			if sb == nil {
				sb = &StackBytes{Stack: stack}
				d.live[stack] = sb
			}
			sb.Bytes += blk.Bytes
			sb.Count++
		}
	case "i":
		d.Segments.InactiveBytes += blk.Bytes
	}
	return blk
}

func blockState(s string) string {
	switch s {
	case "active_allocated":
		return "a"
	case "active_pending_free", "active_awaiting_free":
		return "p"
	}
	return "i"
}

// finish ranks and bounds what was gathered.
func (d *deviceAcc) finish(m *meter) (Device, error) {
	out := d.Device
	if err := m.step(int64(len(d.segs)) + 1); err != nil {
		return out, err
	}
	sort.SliceStable(d.segs, func(i, j int) bool { return d.segs[i].TotalBytes > d.segs[j].TotalBytes })
	out.Segments.List = []Segment{}
	blocks := 0
	for i, s := range d.segs {
		if i >= MaxSegments || blocks+len(s.Blocks) > MaxBlocks {
			out.Segments.Truncated = true
			break
		}
		blocks += len(s.Blocks)
		out.Segments.List = append(out.Segments.List, s)
	}
	sort.SliceStable(out.Segments.List, func(i, j int) bool { return out.Segments.List[i].Address < out.Segments.List[j].Address })
	live := d.live
	if !d.withStack && d.tr != nil {
		live = map[int]*StackBytes{}
		for _, la := range d.tr.live {
			if la.stack < 0 {
				continue
			}
			sb := live[la.stack]
			if sb == nil {
				sb = &StackBytes{Stack: la.stack}
				live[la.stack] = sb
			}
			sb.Bytes += la.bytes
			sb.Count++
		}
	}
	out.TopStacks = topStacks(live)
	out.TraceTopStacks, out.OOMs, out.Timeline = []StackBytes{}, []OOM{}, Timeline{TimeUS: []int64{}, Allocated: []uint64{}, Reserved: []uint64{}}
	if tr := d.tr; tr != nil {
		out.Entries, out.Actions = tr.entries, tr.actions
		out.TraceTopStacks = topStacks(tr.byStack)
		out.OOMs = append(out.OOMs, tr.ooms...)
		out.Timeline = tr.timeline.points(int64(d.Segments.AllocatedBytes), int64(d.Segments.ReservedBytes), tr.alloc, tr.reserved)
	}
	return out, nil
}

func topStacks(m map[int]*StackBytes) []StackBytes {
	out := make([]StackBytes, 0, len(m))
	for _, sb := range m {
		out = append(out, *sb)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Stack < out[j].Stack
	})
	if len(out) > MaxTopStacks {
		out = out[:MaxTopStacks]
	}
	return out
}
