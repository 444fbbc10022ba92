package daemon

import (
	"bytes"
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
	return d.joinWhy(ctx, k, raw)
}

// whyFields is a kernel's why data, its top level only: each field is
// kept as the kernel wrote it, for the kernel's renderer, and only those
// the join reads are decoded, into types (a generic decode of a body costs
// many times its size).
type whyFields map[string]json.RawMessage

// decodeWhy reads the fields of a kernel's why data the join needs; its
// rows stay one list as the kernel wrote it ("[]" when it has none).
func decodeWhy(raw json.RawMessage) (whyFields, attribution.WhyKernel, json.RawMessage, error) {
	var (
		fields whyFields
		k      attribution.WhyKernel
		kind   string
	)
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, k, nil, fmt.Errorf("%w: the kernel's why data is not a JSON object: %v", api.ErrRefused, err)
	}
	if err := json.Unmarshal(fields["kind"], &kind); err != nil || kind != "why" {
		return nil, k, nil, fmt.Errorf("%w: the kernel's data is of kind %.40s, not why", api.ErrRefused, fields["kind"])
	}
	if err := json.Unmarshal(raw, &k); err != nil {
		return nil, k, nil, fmt.Errorf("%w: the kernel's why data: %v", api.ErrRefused, err)
	}
	rows := bytes.TrimSpace(fields["rows"])
	switch {
	case len(rows) == 0 || string(rows) == "null":
		rows = []byte("[]")
	case rows[0] != '[': // valid JSON (Unmarshal checked it): a list starts so, and ends with ']'
		return nil, k, nil, fmt.Errorf("%w: the kernel's why rows are not a list", api.ErrRefused)
	}
	return fields, k, rows, nil
}

// appendRows is the list rows (valid JSON) with more appended.
func appendRows(rows json.RawMessage, more []attribution.WhyRow) (json.RawMessage, error) {
	if len(more) == 0 {
		return rows, nil
	}
	enc, err := json.Marshal(more)
	if err != nil {
		return nil, err
	}
	head := bytes.TrimSpace(rows[1 : len(rows)-1])
	out := make([]byte, 0, len(rows)+len(enc)+1)
	out = append(out, '[')
	if len(head) > 0 {
		out = append(append(out, head...), ',')
	}
	return append(out, enc[1:]...), nil
}

// joinWhy adds to a kernel's why data the rows only the driver's
// per-process figures give (attribution.JoinWhy), and keeps the kernel's
// framework figures as evidence for its stray-context flags.
func (d *Daemon) joinWhy(ctx context.Context, ref api.KernelRef, raw json.RawMessage) (json.RawMessage, error) {
	data, k, rows, err := decodeWhy(raw)
	if err != nil {
		return nil, err
	}
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
	// The kernel's figures are evidence for its flags: record them, then
	// join with the flags the reading, finished, gives.
	d.mu.Lock()
	d.evidence[ref.ConnectionFile] = attribution.JoinWhy(k, nb, obs.Report.GPUs, commands).Evidence
	d.mu.Unlock()
	rep := d.finishNow(obs)
	if nb, ok = notebookOf(rep, ref.ConnectionFile); !ok {
		return nil, fmt.Errorf("kernel %s: %w", ref.ID, api.ErrKernelNotFound)
	}
	j := attribution.JoinWhy(k, nb, rep.GPUs, commands)
	if data["rows"], err = appendRows(rows, j.Rows); err != nil {
		return nil, fmt.Errorf("kernel %s: encode the why rows: %w", ref.ID, err)
	}
	for key, v := range map[string]any{"driver": j.Driver, "stray_contexts": j.StrayContexts} {
		if data[key], err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("kernel %s: encode the why data's %s: %w", ref.ID, key, err)
		}
	}
	return json.Marshal(data)
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
