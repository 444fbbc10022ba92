package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/metrics"
)

// apiBackend is the daemon as the local API sees it (api.Backend): the
// methods that exist only for the API live on it, not on Daemon, whose
// exported surface is what the composition root needs (New, Run, Settle).
type apiBackend struct{ d *Daemon }

var _ api.Backend = apiBackend{}

// api is d's api.Backend.
func (d *Daemon) api() apiBackend { return apiBackend{d} }

// Snapshot implements metrics.Source.
func (d *Daemon) Snapshot() metrics.Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// Report implements api.Backend: the last sample's report.
func (a apiBackend) Report(ctx context.Context) (attribution.Report, error) {
	d := a.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last.SampledAt.IsZero() {
		return attribution.Report{}, fmt.Errorf("no sample yet: the daemon started less than --interval ago")
	}
	return d.last.Report, nil
}

// ReportJSON implements api.Backend: the last sample's report,
// encoded once per sample (outside d.mu: encoding a thousand notebooks
// takes milliseconds, and a sample must not wait for it).
func (a apiBackend) ReportJSON(ctx context.Context) ([]byte, error) {
	d := a.d
	d.mu.Lock()
	if d.last.SampledAt.IsZero() {
		d.mu.Unlock()
		return nil, fmt.Errorf("no sample yet: the daemon started less than --interval ago")
	}
	if d.reportJSON != nil && d.reportJSONSeq == d.sampleSeq {
		body := d.reportJSON
		d.mu.Unlock()
		return body, nil
	}
	rep, seq := d.last.Report, d.sampleSeq
	d.mu.Unlock()
	body, err := json.Marshal(rep)
	if err != nil {
		return nil, fmt.Errorf("encode the report: %w", err)
	}
	d.mu.Lock()
	if seq == d.sampleSeq { // not replaced by a sample meanwhile
		d.reportJSON, d.reportJSONSeq = body, seq
	}
	d.mu.Unlock()
	return body, nil
}

// KernelOfPID implements api.Backend: the kernel (its connection file)
// whose live process tree holds pid.
func (a apiBackend) KernelOfPID(ctx context.Context, pid int) (string, uint32, bool) {
	d := a.d
	table, err := d.fs.ScanTree([]int{pid})
	if err != nil {
		return "", 0, false
	}
	caller, ok := table.Get(pid)
	if !ok {
		return "", 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ks := range d.kernels {
		if ks.cur.isZero() {
			continue
		}
		for _, p := range table.KernelProcesses(ks.cur.PID, ks.cur.Start) {
			if p.PID == caller.PID && p.StartTime == caller.StartTime {
				return ks.connFile, ks.uid, true
			}
		}
	}
	return "", 0, false
}

// KernelNow implements api.Backend: the kernel's figures from a reading
// taken now.
func (a apiBackend) KernelNow(ctx context.Context, k api.KernelRef) (attribution.Notebook, error) {
	d := a.d
	obs, err := d.observe(ctx)
	if err != nil {
		return attribution.Notebook{}, err
	}
	for _, nb := range obs.Report.Notebooks {
		if nb.ConnectionFile == k.ConnectionFile {
			return nb, nil
		}
	}
	return attribution.Notebook{}, fmt.Errorf("kernel %s: %w", k.ID, api.ErrKernelNotFound)
}

// Free implements api.Backend: a free run in the kernel after its current
// cell; cache-only unless req names variables or All. The report carries the
// driver's figure for the kernel's processes before and after, each read
// when it is reported (the last sample may be a second old).
func (a apiBackend) Free(ctx context.Context, k api.KernelRef, req api.FreeRequest) (json.RawMessage, error) {
	d := a.d
	client, err := d.attachedClient(k)
	if err != nil {
		return nil, err
	}
	// The driver's figure, read now before and after: the report's JSON
	// and the kernel's text show the same two readings.
	driverNow := func(ctx context.Context) *uint64 {
		nb, err := a.KernelNow(ctx, k)
		if err != nil {
			return nil
		}
		return &nb.GPUMemoryBytes
	}
	rep, err := magics.FreeCache(ctx, client, magics.FreeOptions{Vars: req.Vars, All: req.All, DriverBytes: driverNow})
	if errors.Is(err, magics.ErrFreeRefused) {
		return nil, fmt.Errorf("%w: %w", api.ErrRefused, err)
	}
	if err != nil {
		return nil, err
	}
	d.sampleSoon() // the report too
	return json.Marshal(rep)
}

// Kernels implements api.Backend: the kernels followed, alive while the
// attached client's connection stands (its iopub socket).
func (a apiBackend) Kernels(ctx context.Context) ([]api.KernelStatus, error) {
	d := a.d
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]api.KernelStatus, 0, len(d.kernels))
	for _, ks := range d.kernels {
		st := api.KernelStatus{KernelID: ks.id, Notebook: ks.notebook, PID: ks.cur.PID,
			ConnectionFile: ks.connFile, ServerURL: ks.serverURL}
		if ks.client != nil {
			st.Alive = ks.client.Alive()
			st.Language = ks.client.LastKernelInfo().Language
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Notebook != out[j].Notebook {
			return out[i].Notebook < out[j].Notebook
		}
		return out[i].ConnectionFile < out[j].ConnectionFile
	})
	return out, nil
}

// attachedClient is the client attached to the kernel of k's connection
// file, or an error wrapping api.ErrKernelNotFound for a kernel the daemon
// does not follow (never another kernel of the same id).
func (d *Daemon) attachedClient(k api.KernelRef) (*protocol.Client, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ks, ok := d.kernels[k.ConnectionFile]
	if !ok || ks.id != k.ID {
		return nil, fmt.Errorf("kernel %s: %w", k.ID, api.ErrKernelNotFound)
	}
	if ks.client == nil {
		return nil, fmt.Errorf("kernel %s is not attached yet (starting, or not answering); try again", k.ID)
	}
	return ks.client, nil
}
