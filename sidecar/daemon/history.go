package daemon

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
)

// historyParts is what the daemon remembers over time for the API's
// history endpoint and the JupyterLab panel: figures per GPU and notebook,
// and reclaim events.
type historyParts struct {
	store  *history.Store
	events *history.Events

	mu      sync.Mutex
	last    int64         // unix second of the newest sample recorded
	sampled chan struct{} // closed (and replaced) after each sample
}

func newHistoryParts(interval time.Duration) *historyParts {
	return &historyParts{store: history.New(history.Options{FineStep: interval}), events: history.NewEvents(),
		sampled: make(chan struct{})}
}

// recorded wakes the waiting history requests.
func (h *historyParts) recorded(t int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = max(h.last, t)
	close(h.sampled)
	h.sampled = make(chan struct{})
}

// sampledChan is closed after the next sample.
func (h *historyParts) sampledChan() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sampled
}

// waitSample returns once a sample of second since or later is recorded,
// or after limit, or when ctx ends.
func (h *historyParts) waitSample(ctx context.Context, since int64, limit time.Duration) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		h.mu.Lock()
		last, ch := h.last, h.sampled
		h.mu.Unlock()
		if last >= since {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// recordHistory adds a sample's figures (the joined report's, which Finish
// does not change) to the history, and returns when they were recorded and
// each notebook's peak since its kernel process started, by connection
// file, for Finish.
func (d *Daemon) recordHistory(now time.Time, rep *attribution.Report) (int64, map[string]uint64) {
	n := len(rep.GPUs)
	for _, nb := range rep.Notebooks {
		n += 2 + len(nb.PerGPU)
	}
	samples := make([]history.Sample, 0, n) // sized: a thousand notebooks' figures, every second
	for _, g := range rep.GPUs {
		samples = append(samples, history.Sample{Key: history.Key{Kind: history.KindGPU, ID: strconv.Itoa(g.Index)}, Bytes: g.MemoryUsedBytes})
	}
	for _, nb := range rep.Notebooks {
		gen := ""
		if len(nb.PIDs) > 0 {
			gen = strconv.Itoa(nb.PIDs[0])
		}
		samples = append(samples, history.Sample{Key: notebookKey(nb.ConnectionFile), Label: nb.KernelID,
			Bytes: nb.GPUMemoryBytes, Generation: gen})
		// Its bytes on each GPU too: a GPU's plot draws only what the
		// notebook holds there, never its total over every GPU.
		for _, pg := range nb.PerGPU {
			samples = append(samples, history.Sample{Key: history.NotebookGPUKey(nb.ConnectionFile, pg.Index), Label: nb.KernelID,
				Bytes: pg.Bytes, Generation: gen})
		}
		if nb.Utilization != nil {
			samples = append(samples, history.Sample{Key: history.Key{Kind: history.KindNotebookSM, ID: nb.ConnectionFile}, Label: nb.KernelID,
				Bytes: uint64(nb.Utilization.SMPercent), Generation: gen})
		}
	}
	d.hist.store.Record(now, samples)
	peaks := make(map[string]uint64, len(rep.Notebooks))
	for _, nb := range rep.Notebooks {
		if p, ok := d.hist.store.Peak(notebookKey(nb.ConnectionFile)); ok {
			peaks[nb.ConnectionFile] = p
		}
	}
	return now.Unix(), peaks
}

// notebookKey is the series of the kernel of a connection file: kernels
// are known by their file, since two users' kernels may share an id.
func notebookKey(connectionFile string) history.Key {
	return history.Key{Kind: history.KindNotebook, ID: connectionFile}
}

// historySampled wakes the waiting history requests; sample calls it once
// the new report is in place, so that they read it.
func (d *Daemon) historySampled(at int64) { d.hist.recorded(at) }

// recordReclaim keeps one event per reclaim that ended processes.
func (d *Daemon) recordReclaim(ks *kernelState, notebook, why string, processes int, bytes uint64) {
	if processes == 0 {
		return
	}
	user := ""
	d.mu.Lock()
	for _, nb := range d.pub.last.Report.Notebooks {
		if nb.ConnectionFile == ks.connFile {
			user = nb.User
		}
	}
	d.mu.Unlock()
	d.hist.events.Add(history.Event{Time: time.Now().Unix(), Kind: "reclaim", KernelID: ks.id,
		ConnectionFile: ks.connFile, Notebook: notebook, User: user, Reason: why, Processes: processes, Bytes: bytes,
		Message: history.ReclaimMessage(notebook, ks.id, why, processes, bytes)})
}

// History implements api.Backend.
func (a apiBackend) History(ctx context.Context, q api.HistoryQuery) (api.HistoryResponse, error) {
	d := a.d
	since, eventsAfter := q.Since, q.EventsAfter
	if q.Wait && since > 0 {
		d.hist.waitSample(ctx, since, 2*d.cfg.Interval+time.Second)
	}
	rep, err := a.Report(ctx)
	if err != nil {
		return api.HistoryResponse{}, err
	}
	now := time.Now()
	if since <= 0 {
		since = now.Add(-d.hist.store.Options().FineWindow).Unix()
	}
	resp := api.HistoryResponse{Now: now.Unix(), AlertThreshold: d.cfg.AlertThreshold, Report: rep}
	resp.GPUs, resp.Notebooks, resp.NotebookSM, resp.StepSeconds = historySeries(d.hist.store.Since(now, since))
	if resp.StepSeconds == 0 {
		resp.StepSeconds = max(int64(d.cfg.Interval/time.Second), 1)
	}
	resp.Events, resp.LastEvent = d.hist.events.After(eventsAfter)
	return resp, nil
}

// historySeries shapes the store's series for the API: the GPUs' apart,
// and per notebook (its kernel id, and its connection file, the kernel's
// identity) its total and its bytes on each GPU (marked with the GPU's
// index), and apart its SM utilization; step is the points' spacing (0
// without any series).
func historySeries(srs []history.Series) (gpus, notebooks, notebookSM []api.HistorySeries, step int64) {
	gpus, notebooks, notebookSM = []api.HistorySeries{}, []api.HistorySeries{}, []api.HistorySeries{}
	for _, sr := range srs {
		hs := api.HistorySeries{ID: sr.Key.ID, Peak: sr.Peak, PeakAt: sr.PeakAt, Points: make([][2]uint64, len(sr.Points))}
		for i, p := range sr.Points {
			hs.Points[i] = [2]uint64{uint64(p.Time), p.Bytes}
		}
		step = sr.Step
		switch sr.Key.Kind {
		case history.KindGPU:
			gpus = append(gpus, hs)
		case history.KindNotebook:
			hs.ID, hs.ConnectionFile = sr.Label, sr.Key.ID
			notebooks = append(notebooks, hs)
		case history.KindNotebookSM:
			hs.ID, hs.ConnectionFile = sr.Label, sr.Key.ID
			notebookSM = append(notebookSM, hs)
		case history.KindNotebookGPU:
			connFile, gpu, ok := sr.Key.NotebookGPU()
			if !ok {
				continue
			}
			hs.ID, hs.ConnectionFile, hs.GPU = sr.Label, connFile, &gpu
			notebooks = append(notebooks, hs)
		}
	}
	return gpus, notebooks, notebookSM, step
}

// KernelVars implements api.Backend: %gpumem vars's data.
func (a apiBackend) KernelVars(ctx context.Context, k api.KernelRef, allDevices bool) (json.RawMessage, error) {
	d := a.d
	return d.kernelQuery(ctx, k, func(ctx context.Context, ex magics.Executor) (json.RawMessage, error) {
		return magics.Vars(ctx, ex, allDevices)
	})
}

// KernelSummary implements api.Backend: %gpumem's data.
func (a apiBackend) KernelSummary(ctx context.Context, k api.KernelRef) (json.RawMessage, error) {
	d := a.d
	return d.kernelQuery(ctx, k, magics.Summary)
}

// queryTimeout bounds a kernel query: it waits for the current cell.
const queryTimeout = 20 * time.Second

func (d *Daemon) kernelQuery(ctx context.Context, k api.KernelRef, q func(context.Context, magics.Executor) (json.RawMessage, error)) (json.RawMessage, error) {
	client, err := d.attachedClient(k)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return q(ctx, client)
}
