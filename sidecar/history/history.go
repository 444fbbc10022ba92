// Package history keeps recent GPU memory figures in fixed-size ring
// buffers: per series (one GPU, one notebook's kernel, that kernel's bytes
// on one GPU, or its SM utilization), the last 15 minutes at the sampling
// interval and the last 24 hours at one point a minute (each minute keeps
// the highest figure seen in it, so a short spike is not averaged away). It
// also keeps each notebook's peak since its kernel process started.
//
// It is pure bookkeeping: no I/O, no goroutines, no clock of its own (every
// call is given the time). The daemon records one sample a tick; the API
// reads series since a time.
//
// Memory: points are kept as runs of one figure at even spacing, 16 bytes
// a run, so a flat series (an idle notebook) costs one run per window
// whatever its length: 1,000 flat notebooks over an hour take about 0.3 MiB
// (TestFlatSeriesIsSmall). The bound is a figure that changes at every
// point: Fine.Len + Coarse.Len runs (900 + 1440 by default, 37,440 bytes)
// plus a few hundred bytes of bookkeeping, whatever the sampling rate; 100
// such series and 8 GPUs over 24 h take about 5.2 MiB (TestMemoryBound;
// the bound promised is 8 MiB). A notebook on one GPU is three series (its
// total, its bytes on that GPU and its SM utilization): the daemon's worst
// case for 100 such notebooks is about three times that, within 16 MiB
// (TestMemoryBoundPerGPU).
// Series without a point for longer than the coarse window are dropped.
package history

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Point is one figure at one time (unix seconds).
type Point struct {
	Time  int64
	Bytes uint64
}

// Kind says what a series is about.
type Kind uint8

const (
	// KindGPU: ID is the GPU's index, as text.
	KindGPU Kind = iota
	// KindNotebook: ID is the kernel's connection file (its identity: two
	// users' kernels may share an id), Label its kernel id; the figure is
	// the notebook's total over every GPU.
	KindNotebook
	// KindNotebookSM: a notebook's SM utilization (percent, summed over its
	// GPUs) in place of bytes; ID and Label as KindNotebook's. An unknown figure is
	// no point (a gap), never 0.
	KindNotebookSM
	// KindNotebookGPU: one notebook's bytes on one GPU (NotebookGPUKey), so
	// that a plot of a GPU draws only what each notebook holds there.
	KindNotebookGPU
)

// NotebookGPUKey names the series of a notebook's bytes on one GPU: the
// kernel's connection file (as KindNotebook's ID) and the GPU's index.
func NotebookGPUKey(connFile string, gpu int) Key {
	return Key{Kind: KindNotebookGPU, ID: connFile + "/" + strconv.Itoa(gpu)}
}

// NotebookGPU splits the ID of a KindNotebookGPU key into the connection
// file and the GPU's index; ok is false for any other key.
func (k Key) NotebookGPU() (connFile string, gpu int, ok bool) {
	if k.Kind != KindNotebookGPU {
		return "", 0, false
	}
	i := strings.LastIndexByte(k.ID, '/')
	if i < 0 {
		return "", 0, false
	}
	gpu, err := strconv.Atoi(k.ID[i+1:])
	if err != nil {
		return "", 0, false
	}
	return k.ID[:i], gpu, true
}

// Key names one series.
type Key struct {
	Kind Kind
	ID   string
}

// Sample is one series' figure in one tick.
type Sample struct {
	Key   Key
	Bytes uint64
	// Generation identifies the process behind a notebook's series (its
	// kernel pid and start time, say): when it changes the kernel was
	// restarted and the peak starts again. Unused for GPUs.
	Generation string
	// Label is what the series is shown as (a notebook's kernel id); the
	// newest one is kept.
	Label string
}

// Options size the buffers.
type Options struct {
	FineStep     time.Duration // the sampling interval; default 1 s
	FineWindow   time.Duration // default 15 min
	CoarseStep   time.Duration // default 1 min
	CoarseWindow time.Duration // default 24 h
}

func (o *Options) defaults() {
	if o.FineStep <= 0 {
		o.FineStep = time.Second
	}
	if o.FineWindow <= 0 {
		o.FineWindow = 15 * time.Minute
	}
	if o.CoarseStep <= 0 {
		o.CoarseStep = time.Minute
	}
	if o.CoarseWindow <= 0 {
		o.CoarseWindow = 24 * time.Hour
	}
}

// ring keeps a series' newest points, at most capacity of them, oldest
// first, as runs: a run is points of one figure at evenly spaced times, so
// the second-by-second points of a notebook whose memory does not move
// (most of them, most of the time) take one run of 16 bytes instead of 16
// bytes a point. It is lossless for times from 1970 to 2106 (unix seconds
// in 32 bits): since returns exactly the points pushed. Memory grows with
// the runs held: one run for a flat series, at most capacity runs (a
// figure that changes at every point), as many bytes as the points.
type ring struct {
	runs     []run
	n        int // points held, over every run
	capacity int
}

// run is count points: Bytes at first, first+step, ... first+(count-1)*step.
type run struct {
	bytes uint64
	first uint32 // unix seconds
	step  uint16 // 0 while count == 1
	count uint16
}

func (r run) time(i uint16) int64 { return int64(r.first) + int64(i)*int64(r.step) }

func (r run) lastTime() int64 { return r.time(r.count - 1) }

// clampTime keeps t within a run's 32 unsigned bits of unix seconds.
func clampTime(t int64) int64 { return min(max(t, 0), math.MaxUint32) }

func newRing(capacity int) ring { return ring{capacity: capacity} }

func (r *ring) push(p Point) {
	p.Time = clampTime(p.Time)
	if k := len(r.runs) - 1; k >= 0 && r.runs[k].bytes == p.Bytes && r.runs[k].count < math.MaxUint16 {
		last := &r.runs[k]
		gap := p.Time - last.lastTime()
		if gap > 0 && gap <= math.MaxUint16 && (last.count == 1 || int64(last.step) == gap) {
			last.step = uint16(gap)
			last.count++
			r.n++
			r.trim()
			return
		}
	}
	r.runs = append(r.runs, run{first: uint32(p.Time), count: 1, bytes: p.Bytes})
	r.n++
	r.trim()
}

// trim drops the oldest points beyond capacity.
func (r *ring) trim() {
	for r.n > r.capacity {
		old := &r.runs[0]
		old.first += uint32(old.step)
		old.count--
		r.n--
		if old.count == 0 {
			// Reslicing keeps the array; append copies the live runs into
			// a new one when it fills, so the dropped ones are freed then.
			r.runs = r.runs[1:]
		} else if old.count == 1 {
			old.step = 0
		}
	}
}

// last returns the newest point.
func (r *ring) last() (Point, bool) {
	if len(r.runs) == 0 {
		return Point{}, false
	}
	last := r.runs[len(r.runs)-1]
	return Point{last.lastTime(), last.bytes}, true
}

// setLast replaces the newest point.
func (r *ring) setLast(p Point) {
	k := len(r.runs) - 1
	if r.runs[k].count == 1 {
		r.runs[k] = run{first: uint32(clampTime(p.Time)), count: 1, bytes: p.Bytes}
		return
	}
	r.runs[k].count--
	if r.runs[k].count == 1 {
		r.runs[k].step = 0
	}
	r.n--
	r.push(p)
}

// since appends the points with Time >= t, oldest first.
func (r *ring) since(t int64, out []Point) []Point {
	// Binary search for the first run that ends at or after t: times only grow.
	i := sort.Search(len(r.runs), func(i int) bool { return r.runs[i].lastTime() >= t })
	for ; i < len(r.runs); i++ {
		ru := r.runs[i]
		for j := range ru.count {
			if tm := ru.time(j); tm >= t {
				out = append(out, Point{tm, ru.bytes})
			}
		}
	}
	return out
}

type series struct {
	fine, coarse ring
	peak         uint64
	peakAt       int64
	generation   string
	label        string
}

// Store is every series. It is safe for concurrent use.
type Store struct {
	opts       Options
	fineLen    int
	coarseLen  int
	coarseSecs int64

	mu     sync.Mutex
	series map[Key]*series
	// keys and hits are the series the last Record wrote, at its
	// samples' places: the daemon records the same series in the same
	// order every tick, and a key compared with the one at its place
	// costs less than its hash and lookup among thousands of series.
	keys []Key
	hits []*series
}

// New returns an empty Store.
func New(opts Options) *Store {
	opts.defaults()
	// A sampling interval longer than a window (gpumem serve --interval=1h)
	// still keeps one point: never a ring of no slots.
	return &Store{
		opts:       opts,
		fineLen:    max(1, int(opts.FineWindow/opts.FineStep)),
		coarseLen:  max(1, int(opts.CoarseWindow/opts.CoarseStep)),
		coarseSecs: max(1, int64(opts.CoarseStep/time.Second)),
		series:     map[Key]*series{},
	}
}

// Options returns the sizes in use.
func (s *Store) Options() Options { return s.opts }

// Record adds one tick's figures. Series missing from samples get no point
// (a gap); those silent for longer than the coarse window are dropped. A
// time not after the series' last point replaces nothing and is ignored.
func (s *Store) Record(now time.Time, samples []Sample) {
	t := now.Unix()
	bucket := t - t%max(s.coarseSecs, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sm := range samples {
		var se *series
		if i < len(s.keys) && s.keys[i] == sm.Key {
			se = s.hits[i]
		} else {
			se = s.series[sm.Key]
			if se == nil {
				se = &series{fine: newRing(s.fineLen), coarse: newRing(s.coarseLen), generation: sm.Generation}
				s.series[sm.Key] = se
			}
		}
		if i < len(s.keys) {
			s.keys[i], s.hits[i] = sm.Key, se
		} else {
			s.keys, s.hits = append(s.keys, sm.Key), append(s.hits, se)
		}
		se.label = sm.Label
		if last, ok := se.fine.last(); ok && last.Time >= t {
			continue
		}
		if sm.Generation != se.generation {
			se.generation, se.peak, se.peakAt = sm.Generation, 0, 0
		}
		if sm.Bytes >= se.peak {
			se.peak, se.peakAt = sm.Bytes, t
		}
		se.fine.push(Point{t, sm.Bytes})
		if last, ok := se.coarse.last(); ok && last.Time == bucket {
			if sm.Bytes > last.Bytes {
				se.coarse.setLast(Point{bucket, sm.Bytes})
			}
		} else {
			se.coarse.push(Point{bucket, sm.Bytes})
		}
	}
	clear(s.keys[len(samples):])
	clear(s.hits[len(samples):])
	s.keys, s.hits = s.keys[:len(samples)], s.hits[:len(samples)]
	horizon := t - int64(s.opts.CoarseWindow/time.Second)
	for k, se := range s.series {
		if last, ok := se.fine.last(); !ok || last.Time < horizon {
			delete(s.series, k)
			// A series dropped is no hit: look every key up next time.
			clear(s.keys)
			clear(s.hits)
			s.keys, s.hits = s.keys[:0], s.hits[:0]
		}
	}
}

// Series is one series' points since a time.
type Series struct {
	Key   Key
	Label string
	// Step is the points' spacing in seconds: the fine step when the whole
	// range asked for is in the fine window, else the coarse step.
	Step   int64
	Points []Point
	// Peak is the highest figure since the series' generation began, and
	// when (unix seconds); for a GPU, since the daemon started.
	Peak   uint64
	PeakAt int64
}

// Since returns every series' points with Time >= since, sorted by key.
// When since is older than the fine window allows (now - FineWindow) the
// coarse points are returned.
func (s *Store) Since(now time.Time, since int64) []Series {
	coarse := since < now.Unix()-int64(s.opts.FineWindow/time.Second)
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Series, 0, len(s.series))
	for k, se := range s.series {
		sr := Series{Key: k, Label: se.label, Peak: se.peak, PeakAt: se.peakAt, Step: int64(s.opts.FineStep / time.Second)}
		if coarse {
			sr.Step = s.coarseSecs
			sr.Points = se.coarse.since(since, nil)
		} else {
			sr.Points = se.fine.since(since, nil)
		}
		out = append(out, sr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key.Kind != out[j].Key.Kind {
			return out[i].Key.Kind < out[j].Key.Kind
		}
		return out[i].Key.ID < out[j].Key.ID
	})
	return out
}

// Peak is a series' peak since its generation began; ok is false for an
// unknown series.
func (s *Store) Peak(k Key) (peak uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.series[k]
	if se == nil {
		return 0, false
	}
	return se.peak, true
}

// Len is the number of series kept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.series)
}
