package daemon

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
	"github.com/gpumem/gpumem/sidecar/oom"
)

// A kernel reports an out-of-memory error once per cell that raised one
// (its post_run_cell hook): more than this many a minute is not cells.
const (
	oomBurst  = 20
	oomWindow = time.Minute
)

// oomLog is what the daemon remembers of out-of-memory errors per kernel:
// counts for `gpumem ls --json` (the events themselves live in the
// history's event log) and the recent reports, to refuse a flood.
type oomLog struct {
	mu      sync.Mutex
	summary map[string]*attribution.OOMSummary // by connection file
	recent  map[string][]time.Time             // by connection file
}

func newOOMLog() *oomLog {
	return &oomLog{summary: map[string]*attribution.OOMSummary{}, recent: map[string][]time.Time{}}
}

// allow says whether the kernel of connFile may report one more error at now.
func (l *oomLog) allow(connFile string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := l.recent[connFile][:0]
	for _, t := range l.recent[connFile] {
		if now.Sub(t) < oomWindow {
			keep = append(keep, t)
		}
	}
	if len(keep) >= oomBurst {
		l.recent[connFile] = keep
		return false
	}
	l.recent[connFile] = append(keep, now)
	return true
}

func (l *oomLog) record(ev oom.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.summary[ev.ConnectionFile]
	if s == nil {
		s = &attribution.OOMSummary{}
		l.summary[ev.ConnectionFile] = s
	}
	s.Count++
	s.LastTime, s.LastRequestedBytes, s.LastEvent, s.LastGPU, s.LastHeadline = ev.Time, ev.RequestedBytes, ev.Seq, nil, ev.Headline
	if ev.GPU != nil {
		g := ev.GPU.Index
		s.LastGPU = &g
	}
}

// summaries are the OOM summaries of rep's notebooks (by connection
// file, for attribution.Finish); kernels no longer in rep are forgotten.
func (l *oomLog) summaries(rep attribution.Report) map[string]attribution.OOMSummary {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]attribution.OOMSummary{}
	if len(l.summary) == 0 && len(l.recent) == 0 {
		return out // nothing to give or forget: no map of every notebook each sample
	}
	present := make(map[string]bool, len(rep.Notebooks))
	for _, nb := range rep.Notebooks {
		present[nb.ConnectionFile] = true
		if s := l.summary[nb.ConnectionFile]; s != nil {
			out[nb.ConnectionFile] = *s
		}
	}
	for file := range l.summary {
		if !present[file] {
			delete(l.summary, file)
		}
	}
	for file := range l.recent {
		if !present[file] {
			delete(l.recent, file)
		}
	}
	return out
}

// RecordOOM implements api.Backend: the event of an out-of-memory error
// that a process of kernel k reported, assessed against the last sample's
// published report (finished: oom.Assess reads its GPUs' ranked holders),
// kept in the event log, counted and logged.
func (a apiBackend) RecordOOM(ctx context.Context, k api.KernelRef, req oom.Request) (oom.Event, error) {
	d := a.d
	now := time.Now()
	d.mu.Lock()
	rep, sampledAt := d.pub.last.Report, d.pub.last.SampledAt
	d.mu.Unlock()
	if sampledAt.IsZero() {
		return oom.Event{}, errors.New("no sample yet: the daemon started less than --interval ago")
	}
	if !d.ooms.allow(k.ConnectionFile, now) {
		return oom.Event{}, fmt.Errorf("kernel %s reported more than %d out-of-memory errors in %s: %w", k.ID, oomBurst, units.Duration(oomWindow), api.ErrTooMany)
	}
	ev := oom.Assess(rep, k.ID, k.ConnectionFile, req, sampledAt, now)
	ev.Seq = d.hist.events.Add(history.Event{Time: ev.Time, Kind: "oom", KernelID: k.ID, ConnectionFile: k.ConnectionFile,
		Notebook: ev.Notebook, User: ev.User, Reason: ev.Headline, Bytes: ev.RequestedBytes, OOM: &ev})
	d.ooms.record(ev)
	gpu := "unknown"
	if ev.GPU != nil {
		gpu = strconv.Itoa(ev.GPU.Index)
	}
	d.metrics.AddOOM(ev.Notebook, ev.User, gpu)
	d.log.Warn().Str("kernel_id", k.ID).Str("connection_file", k.ConnectionFile).Str("notebook", ev.Notebook).Str("user", ev.User).Str("gpu", gpu).
		Str("framework", ev.Framework).Uint64("requested_bytes", ev.RequestedBytes).Str("advice", ev.Advice).
		Msg("out-of-memory error in a kernel")
	return ev, nil
}

// OOMEvents implements api.Backend: the out-of-memory events still in
// the event log, oldest first.
func (a apiBackend) OOMEvents(ctx context.Context) ([]oom.Event, error) {
	d := a.d
	evs, _ := d.hist.events.After(0)
	out := []oom.Event{}
	for _, e := range evs {
		if e.Kind == "oom" && e.OOM != nil {
			out = append(out, *e.OOM)
		}
	}
	return out, nil
}
