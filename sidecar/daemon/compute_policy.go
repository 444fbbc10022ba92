package daemon

import (
	"fmt"
	"sort"
	"time"

	"github.com/gpumem/gpumem/internal/units"
)

// "Computing", as reclaim and culling use it: a process computes when, in
// the window asked about, at least computeMinActive of its readings show
// it at or above the threshold of SM or memory busy time. One reading
// alone never decides: a single spike (a last synchronize, a kernel at
// exit) does not make an idle process busy, and a single quiet reading (a
// checkpoint write, a pause for data) does not make a busy one idle, since
// its other readings still count. Idle needs evidence too: at least
// computeMinKnown known readings and no doubt left by unknown ones.
// Otherwise the verdict is unknown, and reclaim never ends a process on
// an unknown verdict unless told to (--reclaim-unknown=end): a wrong kill
// is the worst thing gpumem can do, losing a job's work the next worst.

const (
	// computeMinActive readings at or above the threshold make a process
	// computing.
	computeMinActive = 2
	// computeMinKnown known readings at least are needed to call it idle.
	computeMinKnown = 3
)

// ComputeConfig is `gpumem serve --compute-*` and --reclaim-unknown.
type ComputeConfig struct {
	// Window is how far back "computed" looks: the readings of the last
	// Window count (for reclaim: from Window before the kernel's exit to
	// the decision). Default 1 min.
	Window time.Duration
	// ThresholdPercent of SM or memory busy time makes a reading active
	// (default 1).
	ThresholdPercent uint32
	// ReclaimUnknown is what reclaim does with a survivor whose
	// utilization cannot be judged: ReclaimKeep (default) or ReclaimEnd.
	ReclaimUnknown string
}

// What reclaim does with a survivor it cannot judge.
const (
	ReclaimKeep = "keep"
	ReclaimEnd  = "end"
)

func (c *ComputeConfig) defaults() {
	if c.Window <= 0 {
		c.Window = time.Minute
	}
	if c.ThresholdPercent == 0 {
		c.ThresholdPercent = 1
	}
	if c.ReclaimUnknown == "" {
		c.ReclaimUnknown = ReclaimKeep
	}
}

// Validate checks the flags.
func (c ComputeConfig) Validate() error {
	switch c.ReclaimUnknown {
	case "", ReclaimKeep, ReclaimEnd:
	default:
		return fmt.Errorf("--reclaim-unknown=%q: want keep or end", c.ReclaimUnknown)
	}
	if c.ThresholdPercent > 100 {
		return fmt.Errorf("--compute-threshold=%d: want a percentage from 1 to 100", c.ThresholdPercent)
	}
	if c.Window < 0 {
		return fmt.Errorf("--compute-window=%v: want a positive duration", c.Window)
	}
	return nil
}

// utilSample is one reading of a process's utilization at one sample: the
// highest over its GPUs.
type utilSample struct {
	at      sampleTime
	known   bool
	sm, mem uint32
	// reading is NVML's timestamp of the reading (0: none): a reading that
	// two samples both saw counts once.
	reading uint64
}

// sampleTime is a sample's time as the nanoseconds from sampleEpoch to it
// (time.Time.Sub: on the monotonic clock where both have a reading of it,
// as the daemon's times do): a reading kept holds no pointer, as a
// time.Time does (its location), so that the collector need not scan the
// readings of a host's thousands of GPU processes, a minute of them each.
type sampleTime int64

// sampleEpoch is what sampleTimes count from.
var sampleEpoch = time.Now()

func atTime(t time.Time) sampleTime { return sampleTime(t.Sub(sampleEpoch)) }

// Time is s as a time.Time: with a monotonic reading, as sampleEpoch has
// one; its wall clock is sampleEpoch's moved by s.
func (s sampleTime) Time() time.Time { return sampleEpoch.Add(time.Duration(s)) }

// computeVerdict is what a window of readings says.
type computeVerdict uint8

const (
	verdictUnknown computeVerdict = iota
	verdictIdle
	verdictComputing
)

func (v computeVerdict) String() string {
	switch v {
	case verdictIdle:
		return "idle"
	case verdictComputing:
		return "computing"
	}
	return "unknown"
}

// judgement is a verdict and what it rests on.
type judgement struct {
	verdict computeVerdict
	// lastActive is the newest active reading's sample time (zero: none).
	lastActive time.Time
	// settling: unknown only for want of readings yet (a process just
	// seen, a daemon just started), not because the GPU cannot say.
	settling bool
	// What why says: the readings counted, or a note of its own. Kept as
	// figures: a sample judges every process, and only some verdicts are
	// ever put in words.
	known, unknown, active int
	window                 time.Duration
	threshold              uint32
	note                   string
}

// why says, for people, what the verdict rests on.
func (j judgement) why() string {
	switch {
	case j.note != "":
		return j.note
	case j.verdict == verdictComputing:
		return fmt.Sprintf("%d readings at or above %d%% SM or memory in the last %s", j.active, j.threshold, units.Duration(j.window))
	case j.verdict == verdictIdle:
		return fmt.Sprintf("%d readings, %d at or above %d%% SM or memory, in the last %s", j.known, j.active, j.threshold, units.Duration(j.window))
	case j.settling || j.unknown == 0:
		return fmt.Sprintf("%d readings so far, %d needed to call it idle", j.known, computeMinKnown)
	}
	return fmt.Sprintf("GPU utilization unknown in %d of %d readings", j.unknown, j.known+j.unknown)
}

// judge is the policy, pure: the verdict of the readings in samples taken
// within [from, to].
func (c ComputeConfig) judge(samples []utilSample, from, to time.Time) judgement {
	j := judgement{window: to.Sub(from).Round(time.Second), threshold: c.ThresholdPercent}
	// A reading stays a process's figure until a newer one replaces it, so
	// the samples that saw it again follow one another: comparing with the
	// last one counted is enough.
	var lastReading uint64
	lo, hi := atTime(from), atTime(to)
	var lastActive sampleTime
	anyActive := false
	for _, s := range samples {
		if s.at < lo || s.at > hi {
			continue
		}
		if !s.known {
			j.unknown++
			continue
		}
		j.known++
		if !c.active(s) {
			continue
		}
		if s.reading != 0 {
			if s.reading == lastReading {
				continue
			}
			lastReading = s.reading
		}
		j.active++
		if !anyActive || s.at > lastActive {
			lastActive, anyActive = s.at, true
		}
	}
	if anyActive {
		j.lastActive = lastActive.Time()
	}
	return j.decided()
}

// active says whether a known reading is at or above the threshold.
func (c ComputeConfig) active(s utilSample) bool {
	return s.sm >= c.ThresholdPercent || s.mem >= c.ThresholdPercent
}

// judgeIdle is judge for readings that are all known and none active
// (procReadings counts them), sorted by time: only how many fall within
// [from, to] is left to find, by binary search rather than a look at each.
func (c ComputeConfig) judgeIdle(samples []utilSample, from, to time.Time) judgement {
	j := judgement{window: to.Sub(from).Round(time.Second), threshold: c.ThresholdPercent}
	lo, hi := atTime(from), atTime(to)
	first := sort.Search(len(samples), func(i int) bool { return samples[i].at >= lo })
	end := sort.Search(len(samples), func(i int) bool { return samples[i].at > hi })
	j.known = max(0, end-first)
	return j.decided()
}

// decided is j with the verdict its counts give.
func (j judgement) decided() judgement {
	switch {
	case j.active >= computeMinActive:
		j.verdict = verdictComputing
	case j.active+j.unknown >= computeMinActive:
		j.verdict = verdictUnknown
	case j.known < computeMinKnown:
		j.verdict, j.settling = verdictUnknown, j.unknown == 0
	default:
		j.verdict = verdictIdle
	}
	return j
}

// mayEnd says whether reclaim may end a survivor judged j, and if not,
// why it is left running.
func (c ComputeConfig) mayEnd(j judgement) (bool, string) {
	switch {
	case j.verdict == verdictIdle:
		return true, ""
	case j.verdict == verdictComputing:
		return false, "computing on a GPU (" + j.why() + ")"
	case c.ReclaimUnknown == ReclaimEnd:
		return true, ""
	}
	return false, "its GPU utilization is unknown (" + j.why() + "); --reclaim-unknown=end would end it"
}

// combine is the verdict of a notebook from its processes': computing if
// one computes, idle if every one is idle, else unknown (settling while
// one only wants readings). With no process on a GPU it is idle, if the
// GPUs can say so (known).
func combine(js []judgement, known bool) judgement {
	if len(js) == 0 {
		if known {
			return judgement{verdict: verdictIdle, note: "no process on a GPU"}
		}
		return judgement{verdict: verdictUnknown, note: "no GPU reports per-process utilization"}
	}
	// The verdict's words are those of the process that decided it.
	out, basis := judgement{verdict: verdictIdle}, js[0]
	for _, j := range js {
		if j.lastActive.After(out.lastActive) {
			out.lastActive = j.lastActive
		}
		out.settling = out.settling || j.settling
		switch {
		case j.verdict == verdictComputing && out.verdict != verdictComputing:
			out.verdict, basis = verdictComputing, j
		case j.verdict == verdictUnknown && out.verdict == verdictIdle:
			out.verdict, basis = verdictUnknown, j
		}
	}
	out.known, out.unknown, out.active, out.window, out.threshold, out.note =
		basis.known, basis.unknown, basis.active, basis.window, basis.threshold, basis.note
	out.settling = out.settling && out.verdict != verdictComputing
	return out
}
