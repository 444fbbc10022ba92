package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// KernelWhy implements api.Backend: %gpumem why's rows for a kernel,
// read after its current cell, joined with the driver's figures read now,
// and rendered by the kernel (the data carries its text and html).
func (a apiBackend) KernelWhy(ctx context.Context, k api.KernelRef, q api.WhyQuery) (json.RawMessage, error) {
	d := a.d
	client, err := d.attachedClient(k)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	raw, err := magics.Why(ctx, client, magics.WhyOptions{Device: q.Device, AllDevices: q.AllDevices, Budget: q.Budget})
	if err != nil {
		return nil, err
	}
	joined, err := d.joinWhy(ctx, k, raw)
	if err != nil {
		return nil, err
	}
	return magics.Render(ctx, client, joined)
}

// JoinWhy implements api.Backend: the why data a kernel computed itself
// (%gpumem why in the notebook), joined with the driver's figures read
// now. The kernel renders the reply.
func (a apiBackend) JoinWhy(ctx context.Context, k api.KernelRef, raw json.RawMessage) (json.RawMessage, error) {
	d := a.d
	joined, err := d.joinWhy(ctx, k, raw)
	if err != nil {
		return nil, err
	}
	return json.Marshal(joined)
}

// joinWhy adds to a kernel's why data the rows only the driver's
// per-process figures give (attribution.JoinWhy), and keeps the kernel's
// framework figures as evidence for its stray-context flags.
func (d *Daemon) joinWhy(ctx context.Context, ref api.KernelRef, raw json.RawMessage) (map[string]any, error) {
	var data map[string]any
	if err := json.Unmarshal(raw, &data); err != nil {
		return nil, fmt.Errorf("%w: the kernel's why data is not a JSON object: %v", api.ErrRefused, err)
	}
	if data["kind"] != "why" {
		return nil, fmt.Errorf("%w: the kernel's data is of kind %v, not why", api.ErrRefused, data["kind"])
	}
	var k attribution.WhyKernel
	if err := json.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("%w: the kernel's why data: %v", api.ErrRefused, err)
	}
	rows, _ := data["rows"].([]any)
	obs, err := d.observe(ctx)
	if err != nil {
		return nil, err
	}
	nb, ok := notebookOf(obs.Report, ref.ConnectionFile)
	if !ok {
		return nil, fmt.Errorf("kernel %s: %w", ref.ID, api.ErrKernelNotFound)
	}
	commands := map[int]string{}
	for _, p := range nb.Processes {
		if tp, ok := obs.Table.Get(p.PID); ok {
			commands[p.PID] = procs.CommandLine(tp.Argv, tp.Comm, attribution.MaxCommandLen)
		}
	}
	// The kernel's figures are evidence for its flags: record them, flag
	// again, then join with the flags they give.
	j := attribution.JoinWhy(k, nb, obs.Report.GPUs, commands)
	d.mu.Lock()
	d.evidence[ref.ConnectionFile] = j.Evidence
	ev := maps.Clone(d.evidence)
	d.mu.Unlock()
	one := attribution.Report{Notebooks: []attribution.Notebook{nb}}
	attribution.FlagStrayContexts(&one, ev)
	j = attribution.JoinWhy(k, one.Notebooks[0], obs.Report.GPUs, commands)
	for _, r := range j.Rows {
		rows = append(rows, r)
	}
	data["rows"] = rows
	data["driver"] = j.Driver
	data["stray_contexts"] = j.StrayContexts
	return data, nil
}

// strayEvidence is the evidence the kernels' magics gave (for
// attribution.FlagStrayContexts), forgetting that of kernels no longer in
// rep.
func (d *Daemon) strayEvidence(rep attribution.Report) map[string]attribution.FrameworkEvidence {
	d.mu.Lock()
	defer d.mu.Unlock()
	for file := range d.evidence {
		found := false
		for _, nb := range rep.Notebooks {
			found = found || nb.ConnectionFile == file
		}
		if !found {
			delete(d.evidence, file)
		}
	}
	return maps.Clone(d.evidence)
}
