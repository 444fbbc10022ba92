package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/metrics"
	"github.com/gpumem/gpumem/sidecar/procs"
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
	return d.pub.last
}

// Report implements api.Backend: the last sample's report.
func (a apiBackend) Report(ctx context.Context) (attribution.Report, error) {
	d := a.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pub.last.SampledAt.IsZero() {
		return attribution.Report{}, fmt.Errorf("no sample yet: the daemon started less than --interval ago")
	}
	return d.pub.last.Report, nil
}

// ReportJSON implements api.Backend: the last sample's report,
// encoded once per sample (outside d.mu: encoding a thousand notebooks
// takes milliseconds, and a sample must not wait for it).
func (a apiBackend) ReportJSON(ctx context.Context) ([]byte, error) {
	d := a.d
	d.mu.Lock()
	if d.pub.last.SampledAt.IsZero() {
		d.mu.Unlock()
		return nil, fmt.Errorf("no sample yet: the daemon started less than --interval ago")
	}
	if d.pub.json != nil && d.pub.jsonSeq == d.pub.seq {
		body := d.pub.json
		d.mu.Unlock()
		return body, nil
	}
	rep, seq := d.pub.last.Report, d.pub.seq
	d.mu.Unlock()
	body, err := json.Marshal(rep)
	if err != nil {
		return nil, fmt.Errorf("encode the report: %w", err)
	}
	d.mu.Lock()
	if seq == d.pub.seq { // not replaced by a sample meanwhile
		d.pub.json, d.pub.jsonSeq = body, seq
	}
	d.mu.Unlock()
	return body, nil
}

// KernelOfPID implements api.Backend: the kernel (its connection file)
// whose live process tree holds pid. A process belongs to a kernel exactly
// when it or an ancestor is the kernel or in the kernel's session or
// process group (Table.KernelProcesses's rule): so the rule is applied to
// a table of pid's ancestry and of the kernels' own pids it names, a stat
// per generation, never all of /proc (any local user may ask, through
// POST /api/v1/oom, as often as they like).
func (a apiBackend) KernelOfPID(ctx context.Context, pid int) (string, uint32, bool) {
	d := a.d
	type root struct {
		file string
		uid  uint32
		id   procID
	}
	var roots []root
	d.mu.Lock()
	for _, ks := range d.kernels {
		if !ks.cur.isZero() {
			roots = append(roots, root{ks.connFile, ks.uid, ks.cur})
		}
	}
	d.mu.Unlock()
	if len(roots) == 0 || pid <= 0 {
		return "", 0, false
	}
	table, err := d.lineageOf(pid, func(p procs.Proc) []int {
		var pids []int
		for _, r := range roots {
			if r.id.PID == p.PID || r.id.PID == p.SID || r.id.PID == p.PGID {
				pids = append(pids, r.id.PID)
			}
		}
		return pids
	})
	if err != nil {
		return "", 0, false
	}
	caller, ok := table.Get(pid)
	if !ok {
		return "", 0, false
	}
	for _, r := range roots {
		for _, p := range table.KernelProcesses(r.id.PID, r.id.Start) {
			if p.PID == caller.PID && p.StartTime == caller.StartTime {
				return r.file, r.uid, true
			}
		}
	}
	return "", 0, false
}

// lineageReader reads a process's ancestry and single processes' stat
// (procs.FS, procs.Tracker).
type lineageReader interface {
	Ancestry(pid, maxDepth int) ([]procs.Proc, error)
	ReadStats(pids []int) ([]procs.Proc, error)
}

// maxLineage bounds the generations read above a caller: a kernel's
// processes are a few deep, and a deeper chain only costs the reads.
const maxLineage = 256

// lineageOf is the table of pid's ancestry and of the kernel pids that
// kernels names for a process of it (read too: a kernel pid alive with
// another start time is reused, and then its session is no kernel's). A
// reader that reads no single process gives the whole table.
func (d *Daemon) lineageOf(pid int, kernels func(procs.Proc) []int) (*procs.Table, error) {
	lr, ok := d.deps.Procs.(lineageReader)
	if !ok {
		return d.deps.Procs.ScanTree([]int{pid})
	}
	line, err := lr.Ancestry(pid, maxLineage)
	if err != nil {
		return nil, err
	}
	var more []int
	for _, p := range line {
		for _, k := range kernels(p) {
			if !slices.Contains(more, k) && !slices.ContainsFunc(line, func(q procs.Proc) bool { return q.PID == k }) {
				more = append(more, k)
			}
		}
	}
	own, err := lr.ReadStats(more)
	if err != nil {
		return nil, err
	}
	return procs.NewTable(append(line, own...)), nil
}

// KernelNow implements api.Backend: the kernel's row of a reading taken
// now, finished as a sample's is.
func (a apiBackend) KernelNow(ctx context.Context, k api.KernelRef) (attribution.Notebook, error) {
	d := a.d
	obs, err := d.observe(ctx)
	if err != nil {
		return attribution.Notebook{}, err
	}
	for _, nb := range d.finishNow(obs).Notebooks {
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
