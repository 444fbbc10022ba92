package history

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

func at(sec int64) time.Time { return time.Unix(sec, 0) }

func TestRing(t *testing.T) {
	tests := []struct {
		name  string
		cap   int
		push  []int64
		since int64
		want  []int64
	}{
		{"empty", 3, nil, 0, nil},
		{"under capacity", 3, []int64{1, 2}, 0, []int64{1, 2}},
		{"wrapped keeps newest", 3, []int64{1, 2, 3, 4, 5}, 0, []int64{3, 4, 5}},
		{"since in the middle", 4, []int64{1, 2, 3, 4, 5, 6}, 4, []int64{4, 5, 6}},
		{"since after all", 3, []int64{1, 2, 3}, 9, nil},
		{"since between points", 5, []int64{10, 20, 30}, 15, []int64{20, 30}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(tc.cap)
			for _, p := range tc.push {
				r.push(Point{Time: p, Bytes: uint64(p) * 10})
			}
			got := r.since(tc.since, nil)
			if len(got) != len(tc.want) {
				t.Fatalf("since(%d) = %v, want times %v", tc.since, got, tc.want)
			}
			for i, p := range got {
				if p.Time != tc.want[i] || p.Bytes != uint64(tc.want[i])*10 {
					t.Fatalf("since(%d)[%d] = %v, want time %d", tc.since, i, p, tc.want[i])
				}
			}
		})
	}
}

func TestRecordAndSince(t *testing.T) {
	gpu := Key{KindGPU, "0"}
	nb := Key{KindNotebook, "k1"}
	tests := []struct {
		name   string
		ticks  [][]Sample // tick i happens at second 1000+i
		since  int64
		now    int64
		want   map[Key][]Point
		peaks  map[Key]uint64
		series int
	}{
		{
			name:  "fine points per tick",
			ticks: [][]Sample{{{Key: gpu, Bytes: 5}, {Key: nb, Bytes: 1, Generation: "a"}}, {{Key: gpu, Bytes: 7}, {Key: nb, Bytes: 3, Generation: "a"}}},
			since: 1000, now: 1001,
			want:   map[Key][]Point{gpu: {{1000, 5}, {1001, 7}}, nb: {{1000, 1}, {1001, 3}}},
			peaks:  map[Key]uint64{gpu: 7, nb: 3},
			series: 2,
		},
		{
			name:  "a gap when a series is missing from a tick",
			ticks: [][]Sample{{{Key: nb, Bytes: 4}}, {}, {{Key: nb, Bytes: 2}}},
			since: 1001, now: 1002,
			want:   map[Key][]Point{nb: {{1002, 2}}},
			peaks:  map[Key]uint64{nb: 4},
			series: 1,
		},
		{
			name:  "a new generation restarts the peak",
			ticks: [][]Sample{{{Key: nb, Bytes: 9, Generation: "pid1"}}, {{Key: nb, Bytes: 2, Generation: "pid2"}}, {{Key: nb, Bytes: 1, Generation: "pid2"}}},
			since: 0, now: 1002,
			want:   map[Key][]Point{nb: {{960, 9}}}, // coarse: one bucket a minute, its maximum
			peaks:  map[Key]uint64{nb: 2},
			series: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := New(Options{})
			for i, tick := range tc.ticks {
				s.Record(at(1000+int64(i)), tick)
			}
			if s.Len() != tc.series {
				t.Fatalf("Len = %d, want %d", s.Len(), tc.series)
			}
			got := map[Key]Series{}
			for _, sr := range s.Since(at(tc.now), tc.since) {
				got[sr.Key] = sr
			}
			for k, want := range tc.want {
				if fmt.Sprint(got[k].Points) != fmt.Sprint(want) {
					t.Errorf("%v points = %v, want %v", k, got[k].Points, want)
				}
			}
			for k, want := range tc.peaks {
				if got[k].Peak != want {
					t.Errorf("%v peak = %d, want %d", k, got[k].Peak, want)
				}
				if p, ok := s.Peak(k); !ok || p != want {
					t.Errorf("Peak(%v) = %d, %v, want %d", k, p, ok, want)
				}
			}
		})
	}
}

func TestWindows(t *testing.T) {
	s := New(Options{})
	k := Key{KindNotebook, "k"}
	start := int64(1_000_000_030) // 10 s past a minute
	const ticks = 2 * 3600        // two hours at 1 s
	for i := int64(0); i < ticks; i++ {
		s.Record(at(start+i), []Sample{{Key: k, Bytes: uint64(i)}})
	}
	now := at(start + ticks - 1)
	fine := s.Since(now, 0+now.Unix()-15*60+1)[0]
	if fine.Step != 1 || len(fine.Points) != 900 {
		t.Fatalf("fine: step %d, %d points, want 1 s and 900", fine.Step, len(fine.Points))
	}
	coarse := s.Since(now, 0)[0]
	if coarse.Step != 60 || len(coarse.Points) != 121 {
		t.Fatalf("coarse: step %d, %d points, want 60 s and 121 (two hours, first minute partial)", coarse.Step, len(coarse.Points))
	}
	for _, p := range coarse.Points {
		if p.Time%60 != 0 {
			t.Fatalf("coarse point at %d is not on a minute", p.Time)
		}
		// Each minute keeps its maximum: the last second of the minute here.
		if want := uint64(min(p.Time+59-start, ticks-1)); p.Bytes != want {
			t.Fatalf("coarse point %d = %d, want the minute's maximum %d", p.Time, p.Bytes, want)
		}
	}
	// Silent for longer than the coarse window: dropped.
	s.Record(at(start+ticks+25*3600), []Sample{{Key: Key{KindGPU, "0"}, Bytes: 1}})
	if s.Len() != 1 {
		t.Fatalf("after 25 h of silence the notebook series should be gone: %d series", s.Len())
	}
}

func TestRepeatedTimeIgnored(t *testing.T) {
	s := New(Options{})
	k := Key{KindGPU, "0"}
	s.Record(at(5), []Sample{{Key: k, Bytes: 1}})
	s.Record(at(5), []Sample{{Key: k, Bytes: 99}})
	s.Record(at(4), []Sample{{Key: k, Bytes: 98}})
	got := s.Since(at(5), 0)[0].Points
	if len(got) != 1 || got[0].Bytes != 1 {
		t.Fatalf("points = %v, want one point of 1 byte", got)
	}
}

func TestEvents(t *testing.T) {
	l := NewEvents()
	if evs, last := l.After(0); len(evs) != 0 || last != 0 {
		t.Fatalf("empty log: %v, %d", evs, last)
	}
	for i := 0; i < EventCapacity+3; i++ {
		l.Add(Event{Kind: "reclaim", Processes: i})
	}
	evs, last := l.After(0)
	if len(evs) != EventCapacity || last != EventCapacity+3 || evs[0].Seq != 4 {
		t.Fatalf("full log: %d events, last %d, first seq %d", len(evs), last, evs[0].Seq)
	}
	evs, _ = l.After(last - 1)
	if len(evs) != 1 || evs[0].Seq != last {
		t.Fatalf("After(last-1) = %v", evs)
	}
}

// TestMemoryBound measures the heap of 100 notebooks and 8 GPUs after 24 h
// of 1 s samples (simulated time) against the documented bound of 8 MiB.
func TestMemoryBound(t *testing.T) {
	used := fillDay(t, 100, false)
	t.Logf("100 notebooks + 8 GPUs over 24 h: %d bytes (%.2f MiB) of heap", used, float64(used)/(1<<20))
	if used > 8<<20 {
		t.Fatalf("history uses %d bytes, over the 8 MiB bound", used)
	}
}

// TestMemoryBoundPerGPU is the daemon's worst case: each of 100 notebooks
// on one GPU is three series (its total, its bytes on that GPU and its SM
// utilization), against the documented bound of 16 MiB.
func TestMemoryBoundPerGPU(t *testing.T) {
	used := fillDay(t, 100, true)
	t.Logf("100 notebooks on one GPU each + 8 GPUs over 24 h: %d bytes (%.2f MiB) of heap", used, float64(used)/(1<<20))
	if used > 16<<20 {
		t.Fatalf("history uses %d bytes, over the 16 MiB bound", used)
	}
}

// fillDay records 24 h of figures that change at every point for notebooks
// notebooks (and, with perGPU, each one's series on GPU i%8 and its SM
// series) and 8 GPUs,
// checks that every series is full, and returns the heap it took.
func fillDay(t *testing.T, notebooks int, perGPU bool) int64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(Options{})
	samples := make([]Sample, 0, 3*notebooks+8)
	for i := 0; i < notebooks; i++ {
		id := fmt.Sprintf("%036d", i)
		samples = append(samples, Sample{Key: Key{Kind: KindNotebook, ID: id}, Generation: "1234:5678"})
		if perGPU {
			samples = append(samples, Sample{Key: NotebookGPUKey(id, i%8), Generation: "1234:5678"},
				Sample{Key: Key{Kind: KindNotebookSM, ID: id}, Generation: "1234:5678"})
		}
	}
	for i := 0; i < 8; i++ {
		samples = append(samples, Sample{Key: Key{Kind: KindGPU, ID: fmt.Sprint(i)}})
	}
	start := int64(1_700_000_000)
	// Every minute of the day at 1 s would take a while; the rings are full
	// after their windows, so the first 15 min at 1 s and then a point a
	// minute for the remaining day fill both to capacity.
	for t := start; t < start+24*3600; {
		for i := range samples {
			samples[i].Bytes = uint64(t)
		}
		s.Record(at(t), samples)
		if t < start+15*60 {
			t++
		} else {
			t += 60
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	used := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	sr := s.Since(at(start+24*3600), 0)
	if len(sr) != len(samples) || len(sr[0].Points) != 1440 {
		t.Fatalf("want %d series of 1440 coarse points, got %d series of %d", len(samples), len(sr), len(sr[0].Points))
	}
	runtime.KeepAlive(s)
	return used
}

func TestNotebookGPUKey(t *testing.T) {
	for _, tc := range []struct {
		key    Key
		kernel string
		gpu    int
		ok     bool
	}{
		{NotebookGPUKey("4c1f2e0a-aaaa", 0), "4c1f2e0a-aaaa", 0, true},
		{NotebookGPUKey("pod/uid/kernel", 7), "pod/uid/kernel", 7, true},
		{Key{Kind: KindNotebook, ID: "k/1"}, "", 0, false},
		{Key{Kind: KindNotebookGPU, ID: "k"}, "", 0, false},
		{Key{Kind: KindNotebookGPU, ID: "k/x"}, "", 0, false},
	} {
		kernel, gpu, ok := tc.key.NotebookGPU()
		if kernel != tc.kernel || gpu != tc.gpu || ok != tc.ok {
			t.Errorf("%+v.NotebookGPU() = %q, %d, %v; want %q, %d, %v", tc.key, kernel, gpu, ok, tc.kernel, tc.gpu, tc.ok)
		}
	}
}

func BenchmarkRecord100Notebooks(b *testing.B) {
	s := New(Options{})
	samples := make([]Sample, 100)
	for i := range samples {
		samples[i] = Sample{Key: Key{KindNotebook, fmt.Sprint(i)}, Bytes: uint64(i)}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Record(at(int64(1_700_000_000+i)), samples)
	}
}

// A sampling interval longer than a window (or a window of zero slots)
// keeps one point instead of panicking.
func TestIntervalLongerThanWindow(t *testing.T) {
	for _, o := range []Options{
		{FineStep: time.Hour},
		{FineStep: time.Second, FineWindow: time.Millisecond, CoarseStep: 2 * time.Hour, CoarseWindow: time.Hour},
	} {
		s := New(o)
		k := Key{KindNotebook, "k"}
		for i := int64(0); i < 3; i++ {
			s.Record(at(1_000_000_000+i*3600), []Sample{{Key: k, Bytes: uint64(i + 1)}})
		}
		if got := s.fineLen; got < 1 {
			t.Errorf("%+v: fine ring of %d slots", o, got)
		}
	}
}

// TestRingMatchesPoints drives the run-length ring and a plain slice of
// points with the same random pushes and setLasts (flat stretches, changes,
// irregular gaps, a run longer than a run can count) and wants the same
// points back from since, at every capacity.
func TestRingMatchesPoints(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, capacity := range []int{1, 2, 3, 7, 900} {
		r := newRing(capacity)
		var want []Point
		now := int64(1_700_000_000)
		bytes := uint64(5)
		for i := range 200_000 {
			switch x := rng.IntN(100); {
			case x < 3:
				bytes = rng.Uint64N(4) // a change, maybe back to an old figure
			case x < 5 && len(want) > 0:
				// The coarse ring's bucket maximum replaces the newest point.
				p := Point{want[len(want)-1].Time, rng.Uint64N(4)}
				r.setLast(p)
				want[len(want)-1] = p
				continue
			}
			switch x := rng.IntN(100); {
			case x < 2:
				now += int64(rng.IntN(100_000)) + 1 // a gap beyond a run's step
			case x < 10:
				now += 2
			default:
				now++
			}
			r.push(Point{now, bytes})
			if want = append(want, Point{now, bytes}); len(want) > capacity {
				want = want[1:]
			}
			if i%997 == 0 || i == 199_999 {
				since := want[rng.IntN(len(want))].Time
				got := r.since(since, nil)
				var exp []Point
				for _, p := range want {
					if p.Time >= since {
						exp = append(exp, p)
					}
				}
				if !slices.Equal(got, exp) {
					t.Fatalf("capacity %d, after %d pushes: since(%d) = %v, want %v", capacity, i+1, since, got, exp)
				}
				if r.n != len(want) {
					t.Fatalf("capacity %d: ring counts %d points, holds %d", capacity, r.n, len(want))
				}
			}
		}
	}
	// One figure for longer than a run counts (65,535 points).
	r := newRing(100_000)
	for i := range int64(70_000) {
		r.push(Point{1 + i, 7})
	}
	if got := r.since(0, nil); len(got) != 70_000 || got[69_999] != (Point{70_000, 7}) || len(r.runs) != 2 {
		t.Fatalf("70,000 flat points: %d back (last %v) in %d runs, want 70,000 in 2", len(got), got[len(got)-1], len(r.runs))
	}
}

// A flat series, the common case (an idle notebook's memory does not move),
// costs one run whatever its length.
func TestFlatSeriesIsSmall(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(Options{})
	samples := make([]Sample, 1000)
	for i := range samples {
		samples[i] = Sample{Key: Key{KindNotebook, fmt.Sprintf("%036d", i)}, Bytes: uint64(i) << 20, Generation: "1:2"}
	}
	start := int64(1_700_000_000)
	for t := start; t < start+3600; t++ {
		s.Record(at(t), samples)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	used := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("1,000 flat notebooks over an hour at 1 s: %d bytes (%d a series)", used, used/1000)
	if used > 1000*1024 {
		t.Fatalf("%d bytes for 1,000 flat series, want under 1 KiB each", used)
	}
	if sr := s.Since(at(start+3600), start+3600-900); len(sr) != 1000 || len(sr[0].Points) != 900 {
		t.Fatalf("want 1,000 series of 900 fine points, got %d of %d", len(sr), len(sr[0].Points))
	}
	runtime.KeepAlive(s)
}

// Record's memory of the series at each sample's place changes nothing:
// a store recording ticks whose series come and go, change places, and are
// dropped after the coarse window holds what a store that looks every
// key up holds.
func TestRecordHitsMatchLookups(t *testing.T) {
	opts := Options{FineWindow: 20 * time.Second, CoarseWindow: 60 * time.Second, CoarseStep: 10 * time.Second}
	hits, lookups := New(opts), New(opts)
	rng := rand.New(rand.NewPCG(3, 4))
	keys := make([]Key, 12)
	for i := range keys {
		keys[i] = Key{[]Kind{KindGPU, KindNotebook, KindNotebookGPU}[i%3], fmt.Sprintf("s%d", i)}
	}
	for sec := int64(1000); sec < 1300; sec++ {
		var tick []Sample
		for i, k := range keys {
			// Series 0-3 stop for 100 s: dropped, then new again.
			if (i < 4 && sec >= 1100 && sec < 1200) || rng.IntN(10) == 0 {
				continue
			}
			tick = append(tick, Sample{Key: k, Bytes: uint64(rng.IntN(3)), Label: fmt.Sprint(sec % 7), Generation: fmt.Sprint(sec / 50)})
		}
		if rng.IntN(20) == 0 {
			rng.Shuffle(len(tick), func(i, j int) { tick[i], tick[j] = tick[j], tick[i] })
		}
		hits.Record(at(sec), tick)
		lookups.keys, lookups.hits = nil, nil
		lookups.Record(at(sec), tick)
		for _, since := range []int64{sec - 15, sec - 50} {
			if got, want := hits.Since(at(sec), since), lookups.Since(at(sec), since); !equalSeries(got, want) {
				t.Fatalf("at %d since %d:\n got  %+v\n want %+v", sec, since, got, want)
			}
		}
		for _, k := range keys {
			gp, gok := hits.Peak(k)
			wp, wok := lookups.Peak(k)
			if gp != wp || gok != wok {
				t.Fatalf("at %d, peak of %v: %d %v, want %d %v", sec, k, gp, gok, wp, wok)
			}
		}
	}
	if n := len(hits.series); n != len(keys) {
		t.Errorf("%d series kept, want %d", n, len(keys))
	}
}

func equalSeries(a, b []Series) bool {
	return slices.EqualFunc(a, b, func(x, y Series) bool {
		return x.Key == y.Key && x.Label == y.Label && x.Step == y.Step && x.Peak == y.Peak && x.PeakAt == y.PeakAt && slices.Equal(x.Points, y.Points)
	})
}
