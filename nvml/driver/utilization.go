package driver

import (
	"fmt"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpumem/gpumem/nvml"
)

// symProcessUtilization is NVML's per-process utilization (SM and memory
// busy time per process). Drivers without it must never be asked: the call
// would abort the process.
var symProcessUtilization = []string{"nvmlDeviceGetProcessUtilization"}

// DefaultUtilizationWindow is how long a reading of a process's
// utilization stays its current figure when no newer one comes.
const DefaultUtilizationWindow = 2 * time.Second

// Why a device's processes' utilization is unknown (nvml.Device.UtilizationMissing).
const (
	utilNoSymbol     = "the driver lacks nvmlDeviceGetProcessUtilization"
	utilMIG          = "MIG: NVML reports no per-process utilization on MIG instances"
	utilNotSupported = "this GPU does not report per-process utilization"
)

// utilization is what NVML's per-process utilization said lately, per
// device. NVML answers "the samples newer than lastSeenTimeStamp", at
// most one per process that ran kernels since then, and nothing for a
// process that only holds memory (which therefore computes 0): each call
// asks for what came since the newest sample of the call before, and a
// process's newest reading stays its figure for window, so that every
// caller (a daemon's tick, a free's fresh figure, reclaim's look) reads the
// same figures instead of taking the samples from one another.
type utilization struct {
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	devs map[string]*deviceUtil // by UUID
}

// deviceUtil is one device's readings. Only the goroutine sampling that
// device uses it (Source serialises samples).
type deviceUtil struct {
	lastSeen uint64                 // newest sample's timestamp: the next call's lastSeenTimeStamp
	latest   map[uint32]utilReading // per pid, its newest reading
}

type utilReading struct {
	sample gonvml.ProcessUtilizationSample
	seenAt time.Time // when a call first returned it (our clock)
}

func newUtilization(window time.Duration) *utilization {
	if window <= 0 {
		window = DefaultUtilizationWindow
	}
	return &utilization{window: window, now: time.Now, devs: map[string]*deviceUtil{}}
}

func (u *utilization) device(key string) *deviceUtil {
	u.mu.Lock()
	defer u.mu.Unlock()
	d := u.devs[key]
	if d == nil {
		d = &deviceUtil{latest: map[uint32]utilReading{}}
		u.devs[key] = d
	}
	return d
}

// fill sets the Util of each of procs, the processes of device h, from
// NVML's per-process utilization. It returns why the figures are unknown
// ("" when known) and an error worth a warning.
func (u *utilization) fill(key string, h gonvml.Device, procs []nvml.Process) (missing string, err error) {
	d := u.device(key)
	samples, ret, grew := processUtilization(h, d.lastSeen)
	if grew {
		// More processes appeared between go-nvml's two calls: once more.
		samples, ret, grew = processUtilization(h, d.lastSeen)
	}
	switch {
	case grew:
		err := fmt.Errorf("nvml process utilization: the number of samples grew during the query, twice")
		return err.Error(), err
	case ret == gonvml.SUCCESS:
	case ret == gonvml.ERROR_NOT_FOUND, ret == gonvml.ERROR_INSUFFICIENT_SIZE && len(samples) == 0:
		// No sample since lastSeen: no process ran a kernel (NOT_FOUND
		// comes with zeroed entries: they mean nothing). go-nvml returns
		// INSUFFICIENT_SIZE and no samples when NVML counts none.
		samples = nil
	case ret == gonvml.ERROR_NOT_SUPPORTED:
		return utilNotSupported, nil
	default:
		err := nvmlError("process utilization", ret)
		return err.Error(), err
	}
	now := u.now()
	for _, s := range samples {
		// Zeroed entries, figures no percentage can be, and samples not
		// newer than asked for are none of ours.
		if s.Pid == 0 || s.SmUtil > 100 || s.MemUtil > 100 || s.TimeStamp <= d.lastSeen {
			continue
		}
		if old, ok := d.latest[s.Pid]; !ok || s.TimeStamp > old.sample.TimeStamp {
			d.latest[s.Pid] = utilReading{sample: s, seenAt: now}
		}
	}
	for _, s := range samples {
		if s.Pid != 0 && s.TimeStamp > d.lastSeen && s.SmUtil <= 100 && s.MemUtil <= 100 {
			d.lastSeen = max(d.lastSeen, s.TimeStamp)
		}
	}
	for pid, r := range d.latest {
		if !u.current(r, now) {
			delete(d.latest, pid)
		}
	}
	for i := range procs {
		procs[i].Util = nvml.Utilization{Known: true}
		if r, ok := d.latest[uint32(procs[i].PID)]; ok {
			procs[i].Util.SMPercent, procs[i].Util.MemoryPercent = r.sample.SmUtil, r.sample.MemUtil
			procs[i].Util.SampledAt = r.sample.TimeStamp
		}
	}
	return "", nil
}

// current reports whether reading r is still its process's figure at now:
// first returned within the window, and (when its timestamp is on the
// wall clock, as NVML's is: microseconds of gettimeofday) taken within it.
// The first call asks from 0, for every sample the driver keeps: its old
// ones are dropped here.
func (u *utilization) current(r utilReading, now time.Time) bool {
	if now.Sub(r.seenAt) > u.window {
		return false
	}
	taken := time.UnixMicro(int64(r.sample.TimeStamp))
	if d := now.Sub(taken); d > -24*time.Hour && d < 24*time.Hour {
		return d <= u.window
	}
	return true // a timestamp of another clock: judged by when it came
}

// processUtilization calls go-nvml's two-step query (the count, then the
// samples). grew is true when the count grew between the two calls: the
// second answers INSUFFICIENT_SIZE with samples, or go-nvml slices past its
// buffer and panics, which must not end the daemon.
func processUtilization(h gonvml.Device, since uint64) (samples []gonvml.ProcessUtilizationSample, ret gonvml.Return, grew bool) {
	defer func() {
		if recover() != nil {
			samples, ret, grew = nil, gonvml.ERROR_INSUFFICIENT_SIZE, true
		}
	}()
	samples, ret = h.GetProcessUtilization(since)
	return samples, ret, ret == gonvml.ERROR_INSUFFICIENT_SIZE && len(samples) > 0
}
