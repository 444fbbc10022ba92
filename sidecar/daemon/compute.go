package daemon

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// computeState is what the daemon remembers of GPU utilization: each GPU
// process's readings of the last moments (reclaim and culling judge them,
// compute_policy.go), when each kernel's tree last computed, what each
// notebook held while computing nothing (hoarding), and the processes
// reclaim left running. Its own lock: never taken before Daemon.mu.
type computeState struct {
	cfg      ComputeConfig
	interval time.Duration
	keep     time.Duration // how long readings are kept

	mu         sync.Mutex
	procs      map[procID]*procReadings
	computedAt map[string]time.Time // connection file → newest active reading of its kernel's tree
	settling   map[string]bool      // connection file → its kernel's verdict still wants readings
	lastSample time.Time
	hoard      *history.Hoard
	left       map[procID]*leftRunning

	// records counts record's calls: a process's reading of this call
	// (another GPU's line of it) is merged into the one appended.
	records uint64
	// whys are judgements put in words (whyLocked), guarded by mu.
	whys map[judgement]string
}

// maxWhys bounds whys: the judgements a host's notebooks come to are few
// (the counts of readings in a window), but nothing else bounds them.
const maxWhys = 4096

// whyLocked is j.why(), from memory: every sample puts every notebook's
// judgement in words, and most say what they said a second before.
// lastActive is no part of the words: it is left out of the key.
func (c *computeState) whyLocked(j judgement) string {
	j.lastActive = time.Time{}
	if s, ok := c.whys[j]; ok {
		return s
	}
	if c.whys == nil || len(c.whys) >= maxWhys {
		c.whys = map[judgement]string{}
	}
	s := j.why()
	c.whys[j] = s
	return s
}

// leftRunning is a process reclaim did not end, and what it knows of it.
type leftRunning struct {
	attribution.LeftRunning
	id  procID
	uid uint32
	pod string // the dead kernel's pod UID ("" outside any): ending it stays within
}

func newComputeState(cfg ComputeConfig, interval, reclaimWatch time.Duration, hoardWindow time.Duration) *computeState {
	return &computeState{cfg: cfg, interval: interval,
		// Reclaim looks from Window before a kernel's exit to the end of
		// its watch, and starts late by a sample or two.
		keep:  cfg.Window + reclaimWatch + 4*interval + 10*time.Second,
		procs: map[procID]*procReadings{}, computedAt: map[string]time.Time{}, settling: map[string]bool{},
		hoard: history.NewHoard(hoardWindow), left: map[procID]*leftRunning{}}
}

// procReadings are a process's utilization readings, oldest first, and the
// record call that appended the last.
type procReadings struct {
	// The readings are buf[lo:]: those forgotten stay in front of them
	// until an append finds buf full, which then moves the readings to its
	// start when the forgotten are a quarter of it or more, else grows it
	// by half: a minute of readings of each of a host's thousands of GPU
	// processes, appended every second, is then never copied to a new
	// array once the window is full, in an array half as long again.
	buf  []utilSample
	lo   int
	call uint64
	// unknown and active count the readings kept that are unknown, and
	// known and at or above the threshold; unsorted is set once a reading
	// came before the one appended ahead of it (a reclaim's record and a
	// sample's crossing). Readings all known, none active, in order are
	// judged by their count alone (judgeIdle): most GPU processes, most
	// of the time.
	unknown, active int
	unsorted        bool
}

// counted adds the newest reading to the counts (once, when final).
func (r *procReadings) counted(cfg ComputeConfig) {
	ss := r.samples()
	s := ss[len(ss)-1]
	r.tally(cfg, s, 1)
	if len(ss) > 1 && s.at < ss[len(ss)-2].at {
		r.unsorted = true
	}
}

// tally adds d times reading s to the counts.
func (r *procReadings) tally(cfg ComputeConfig, s utilSample, d int) {
	switch {
	case !s.known:
		r.unknown += d
	case cfg.active(s):
		r.active += d
	}
}

// samples are the readings kept, oldest first.
func (r *procReadings) samples() []utilSample { return r.buf[r.lo:] }

// add appends a reading.
func (r *procReadings) add(s utilSample) {
	if len(r.buf) == cap(r.buf) {
		if r.lo > 0 && 4*r.lo >= cap(r.buf) {
			n := copy(r.buf, r.buf[r.lo:])
			r.buf, r.lo = r.buf[:n], 0
		} else {
			live := len(r.buf) - r.lo
			grown := make([]utilSample, live, live+live/2+4)
			copy(grown, r.buf[r.lo:])
			r.buf, r.lo = grown, 0
		}
	}
	r.buf = append(r.buf, s)
}

// forget drops the n oldest readings.
func (r *procReadings) forget(cfg ComputeConfig, n int) {
	for _, s := range r.buf[r.lo : r.lo+n] {
		r.tally(cfg, s, -1)
	}
	r.lo += n
}

// record adds one reading of every GPU process of snap that table knows
// (a process on several GPUs: its highest figures, unknown if any GPU
// cannot say) and forgets readings older than keep.
func (c *computeState) record(now time.Time, snap nvml.Snapshot, table *procs.Table) {
	at := atTime(now)
	horizon := atTime(now.Add(-c.keep))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records++
	call := c.records
	// One map access per GPU process line: a host's thousands of them,
	// every second, made the map's hashing most of what record cost.
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			tp, ok := table.Resolve(p.PID)
			if !ok {
				continue
			}
			id := procID{tp.PID, tp.StartTime}
			r := c.procs[id]
			if r == nil {
				r = &procReadings{}
				c.procs[id] = r
			}
			if r.call != call {
				r.call = call
				r.add(utilSample{at: at, known: true})
			}
			s := &r.buf[len(r.buf)-1]
			s.known = s.known && p.Util.Known
			s.sm, s.mem = max(s.sm, p.Util.SMPercent), max(s.mem, p.Util.MemoryPercent)
			s.reading = max(s.reading, p.Util.SampledAt)
		}
	}
	for id, r := range c.procs {
		if r.call == call {
			r.counted(c.cfg) // this call's reading, every GPU's line of it merged
		}
		ss := r.samples()
		i := 0
		for i < len(ss) && ss[i].at < horizon {
			i++
		}
		if i == len(ss) {
			delete(c.procs, id)
		} else if i > 0 {
			r.forget(c.cfg, i)
		}
	}
}

// samplesLocked is process id's readings, oldest first (nil: none).
func (c *computeState) samplesLocked(id procID) []utilSample {
	if r := c.procs[id]; r != nil {
		return r.samples()
	}
	return nil
}

// judgeLocked judges process id over [from, to].
func (c *computeState) judgeLocked(id procID, from, to time.Time) judgement {
	if r := c.procs[id]; r != nil && r.unknown == 0 && r.active == 0 && !r.unsorted {
		return c.cfg.judgeIdle(r.samples(), from, to)
	}
	return c.cfg.judge(c.samplesLocked(id), from, to)
}

// judge judges process id over [from, to].
func (c *computeState) judge(id procID, from, to time.Time) judgement {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.judgeLocked(id, from, to)
}

// kernelComputedAt is the newest reading in which the tree of the kernel
// of connFile computed (zero: none seen).
func (c *computeState) kernelComputedAt(connFile string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.computedAt[connFile]
}

// kernelSettling reports whether the tree of the kernel of connFile is not
// judged yet for want of readings: culling waits for them.
func (c *computeState) kernelSettling(connFile string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.settling[connFile]
}

// judgeReport judges each notebook of rep over the window, keeps each
// kernel's last computation, adds this sample's hoarding (notebooks and
// processes left running that hold GPU memory and compute nothing) and
// lists the processes left running: the facts Finish's compute step
// writes. table and snap are those rep was attributed from; rep is only
// read.
func (c *computeState) judgeReport(now time.Time, rep *attribution.Report, snap nvml.Snapshot, table *procs.Table) *attribution.ComputeFacts {
	c.mu.Lock()
	defer c.mu.Unlock()
	dt := 0.0
	if !c.lastSample.IsZero() && now.After(c.lastSample) {
		// A daemon stopped for a while (a suspended host) does not count
		// the gap as held.
		dt = min(now.Sub(c.lastSample), 2*max(c.interval, time.Second)).Seconds()
	}
	c.lastSample = now
	from := now.Add(-c.cfg.Window)
	facts := &attribution.ComputeFacts{Kernels: make(map[string]attribution.Compute, len(rep.Notebooks))}
	for _, nb := range rep.Notebooks {
		var js []judgement
		for _, p := range nb.Processes {
			if tp, ok := table.Resolve(p.PID); ok {
				js = append(js, c.judgeLocked(procID{tp.PID, tp.StartTime}, from, now))
			} else {
				js = append(js, judgement{verdict: verdictUnknown, note: "a process not in /proc"})
			}
		}
		// By connection file: another user's kernel may share the id.
		file := nb.ConnectionFile
		j := combine(js, nb.Utilization != nil)
		c.settling[file] = j.settling
		if j.lastActive.After(c.computedAt[file]) {
			c.computedAt[file] = j.lastActive
		}
		c.addHoard(now, file, nb.User, j, nb.GPUMemoryBytes, dt)
		v := attribution.Compute{State: j.verdict.String(), Reason: c.whyLocked(j), LastComputedAt: c.computedAt[file]}
		if bs, ok := c.hoard.Notebook(now, file); ok {
			v.HoardedGiBHours = gibHours(bs)
		}
		facts.Kernels[file] = v
	}
	c.forgetGoneLocked(rep)
	facts.LeftRunning = c.leftRunningLocked(now, from, snap, table, dt)
	window := int64(c.hoard.Window() / time.Second)
	for _, u := range c.hoard.Users(now) {
		facts.Hoarding = append(facts.Hoarding, attribution.UserHoarding{User: u.User, GiBHours: *gibHours(u.ByteSeconds), WindowSeconds: window})
	}
	return facts
}

// gibHours is byte-seconds in GiB·hours.
func gibHours(byteSeconds float64) *float64 {
	v := byteSeconds / (1 << 30) / 3600
	return &v
}

// forgetGoneLocked forgets the computations of kernels gone from rep, once
// they outnumber the live ones.
func (c *computeState) forgetGoneLocked(rep *attribution.Report) {
	if len(c.computedAt)+len(c.settling) <= 3*len(rep.Notebooks)+16 {
		return
	}
	seen := map[string]bool{}
	for _, nb := range rep.Notebooks {
		seen[nb.ConnectionFile] = true
	}
	maps.DeleteFunc(c.computedAt, func(k string, _ time.Time) bool { return !seen[k] })
	maps.DeleteFunc(c.settling, func(k string, _ bool) bool { return !seen[k] })
}

// leftRunningLocked lists the processes left running that still hold GPU
// memory, with this reading's figures, and counts their hoarding; it
// forgets those that exited or hold nothing any more.
func (c *computeState) leftRunningLocked(now, from time.Time, snap nvml.Snapshot, table *procs.Table, dt float64) []attribution.LeftRunning {
	if len(c.left) == 0 {
		return nil
	}
	// The memory and GPUs of each process left running (of those alone:
	// the host's thousands of GPU processes are not wanted here).
	held := attribution.BytesByPID(snap)
	gpusOf := make(map[int][]int, len(c.left))
	for id := range c.left {
		gpusOf[id.PID] = nil
	}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if gs, ok := gpusOf[p.PID]; ok {
				gpusOf[p.PID] = append(gs, d.Index)
			}
		}
	}
	var out []attribution.LeftRunning
	for id, lr := range c.left {
		bytes, holds := held[id.PID]
		if _, alive := table.Lookup(id.PID, id.Start); !alive || !holds {
			delete(c.left, id) // exited, or holds no GPU memory any more
			continue
		}
		lr.Bytes, lr.GPUs = bytes, slices.Clone(gpusOf[id.PID])
		c.addHoard(now, lr.ConnectionFile, lr.User, c.judgeLocked(id, from, now), bytes, dt)
		out = append(out, lr.LeftRunning)
	}
	slices.SortFunc(out, func(a, b attribution.LeftRunning) int {
		return cmp.Or(cmp.Compare(a.KernelID, b.KernelID), cmp.Compare(a.ConnectionFile, b.ConnectionFile), cmp.Compare(a.PID, b.PID))
	})
	return out
}

// judgeSample is the sample's compute step: the readings recorded, then
// judged into the facts Finish writes.
func (d *Daemon) judgeSample(now time.Time, rep *attribution.Report, obs attribution.Observation) *attribution.ComputeFacts {
	d.compute.record(now, obs.Snapshot, obs.Table)
	return d.compute.judgeReport(now, rep, obs.Snapshot, obs.Table)
}

// addHoard counts bytes held for dt seconds while judged idle; a reading
// judged computing counts as known, hoarding nothing; an unknown one
// counts nothing.
func (c *computeState) addHoard(now time.Time, connFile, user string, j judgement, bytes uint64, dt float64) {
	switch j.verdict {
	case verdictIdle:
		c.hoard.Add(now, connFile, user, float64(bytes)*dt)
	case verdictComputing:
		c.hoard.Add(now, connFile, user, 0)
	}
}

// addLeftRunning records a process reclaim left running.
func (c *computeState) addLeftRunning(lr *leftRunning) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left[lr.id] = lr
}

// leftRunningOf lists the processes left running of the kernel of
// connFile.
func (c *computeState) leftRunningOf(connFile string) []leftRunning {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []leftRunning
	for _, lr := range c.left {
		if lr.ConnectionFile == connFile {
			out = append(out, *lr)
		}
	}
	slices.SortFunc(out, func(a, b leftRunning) int { return cmp.Compare(a.PID, b.PID) })
	return out
}

// forgetLeftRunning drops id from the processes left running (it was
// ended).
func (c *computeState) forgetLeftRunning(id procID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.left, id)
}
