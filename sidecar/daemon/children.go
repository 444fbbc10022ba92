package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// FreeChildren implements api.Backend: it ends the processes of a
// live kernel's tree that hold GPU memory, never the kernel itself. First
// the kernel runs the frameworks' own teardown (DataLoader workers, pools,
// ray, inference engines), unless the request came from inside the kernel,
// which ran it already; then what still holds GPU memory is ended under
// reclaim's policy: recorded in this kernel's tree, still alive with the
// same start time (signalled through a pidfd), of the kernel's user, in
// its pod, and in no other live kernel's tree. The report says what ended,
// how, what was left and why, and the driver's figure before and after.
func (a apiBackend) FreeChildren(ctx context.Context, k api.KernelRef, fromKernel bool) (json.RawMessage, error) {
	d := a.d
	kernelID := k.ID
	client, err := d.attachedClient(k)
	if err != nil {
		return nil, err
	}
	// The figures before the teardown: read now or, when the kernel ran
	// its teardown before asking, as ChildrenBefore read them just before
	// it (the last sample's only when the kernel did not ask for that:
	// a sample between the teardown and this request would miss what the
	// teardown ended).
	var before attribution.Notebook
	if fromKernel {
		var ok bool
		if before, ok = d.takeChildrenBefore(k); !ok {
			rep, err := a.Report(ctx)
			if err != nil {
				return nil, err
			}
			before, _ = notebookOf(rep, k.ConnectionFile)
		}
	} else {
		first, err := d.observe(ctx)
		if err != nil {
			return nil, err
		}
		before, _ = notebookOf(first.Report, k.ConnectionFile)
	}
	report := map[string]any{}
	if !fromKernel {
		tctx, cancel := context.WithTimeout(ctx, queryTimeout)
		raw, err := magics.Teardown(tctx, client)
		cancel()
		if err != nil {
			report["teardown_errors"] = []string{fmt.Sprintf("the kernel's teardown did not run: %v", err)}
		} else if err := json.Unmarshal(raw, &report); err != nil {
			return nil, fmt.Errorf("kernel %s: decode its teardown report: %w", kernelID, err)
		}
	}
	// The kernel's teardown report says what it ran; what the report is
	// of, and every figure below, is the daemon's.
	report["kind"], report["schema"], report["kernel_id"] = "children", 1, kernelID
	obs, err := d.observe(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	ks, ok := d.kernels[k.ConnectionFile]
	if !ok || ks.id != k.ID || ks.cur.isZero() {
		d.mu.Unlock()
		return nil, fmt.Errorf("kernel %s: its process is not known yet: %w", kernelID, api.ErrKernelNotFound)
	}
	ks.observe(obs.Table) // the tree as it is now, recorded
	recorded := maps.Clone(ks.recorded)
	self := ks.cur
	keep := d.kernelTreesLocked(obs.Table, ks)
	keep[self] = true
	owner, notebook := ks.uid, ks.notebook
	d.mu.Unlock()
	delete(recorded, self)

	var ended, left []magics.ChildOutcome
	for _, p := range before.Processes {
		if p.PID == self.PID {
			continue
		}
		if _, alive := obs.Table.Get(p.PID); !alive {
			ended = append(ended, magics.ChildOutcome{PID: p.PID, Command: argvOf(recorded, p.PID), Bytes: total(p.PerGPU),
				How: "ended during the frameworks' teardown"})
		}
	}
	held := attribution.BytesByPID(obs.Snapshot)
	policy := reclaimPolicy{selfUID: owner, keep: keep,
		gpuHolder: func(pid int) (uint64, bool) { b, ok := held[pid]; return b, ok }}
	if d.podKernels != nil {
		policy.podOf = d.podOfProcess
		if ks.pod != nil {
			policy.pod = ks.pod.UID
		}
	}
	log := d.log.With().Str("kernel_id", kernelID).Str("connection_file", k.ConnectionFile).Str("notebook", notebook).Logger()
	for _, dec := range policy.decide(recorded, obs.Table) {
		out := magics.ChildOutcome{PID: dec.ID.PID, Command: dec.Argv, Bytes: dec.Bytes}
		if !dec.Kill {
			out.Reason = dec.Reason
			left = append(left, out)
			log.Info().Int("pid", dec.ID.PID).Str("reason", dec.Reason).Msg("free --children: left alone")
			continue
		}
		killed, err := d.terminate(ctx, dec.ID.PID, dec.ID.Start, d.cfg.ReclaimGrace)
		switch {
		case errors.Is(err, errStale):
			continue // gone, its pid reused
		case err != nil:
			out.Reason = err.Error()
			left = append(left, out)
			log.Warn().Err(err).Int("pid", dec.ID.PID).Msg("free --children: could not end it")
			continue
		case killed:
			out.How = "SIGKILL (it ignored SIGTERM)"
		default:
			out.How = "SIGTERM"
		}
		ended = append(ended, out)
		log.Warn().Int("pid", dec.ID.PID).Str("argv", dec.Argv).Uint64("bytes", dec.Bytes).Str("how", out.How).
			Msg("free --children: ended a worker process of a live kernel")
	}
	slices.SortFunc(ended, func(a, b magics.ChildOutcome) int { return a.PID - b.PID })
	after := before
	if last, err := d.observe(ctx); err == nil {
		after, _ = notebookOf(last.Report, k.ConnectionFile)
	}
	report["ended"], report["left"] = nonNilOutcomes(ended), nonNilOutcomes(left)
	report["before"], report["after"] = before.GPUMemoryBytes, after.GPUMemoryBytes
	report["returned_bytes"] = subSat(before.GPUMemoryBytes, after.GPUMemoryBytes)
	d.sampleSoon()
	if fromKernel {
		return json.Marshal(report) // the kernel renders it with what it knows of its children
	}
	rctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	return magics.Render(rctx, client, report)
}

// childrenBeforeTTL is how long ChildrenBefore's figures wait for the
// FreeChildren that follows the kernel's teardown; older ones describe
// another moment.
const childrenBeforeTTL = 2 * time.Minute

// ChildrenBefore implements api.Backend: the driver's figures of the
// kernel's tree, read now, kept for the FreeChildren from inside the
// kernel that follows its own teardown.
func (a apiBackend) ChildrenBefore(ctx context.Context, k api.KernelRef) (json.RawMessage, error) {
	d := a.d
	obs, err := d.observe(ctx)
	if err != nil {
		return nil, err
	}
	nb, _ := notebookOf(obs.Report, k.ConnectionFile)
	d.mu.Lock()
	ks, found := d.kernels[k.ConnectionFile]
	found = found && ks.id == k.ID
	if found {
		ks.childrenBefore, ks.childrenBeforeAt = nb, time.Now()
	}
	d.mu.Unlock()
	if !found {
		return nil, fmt.Errorf("kernel %s: %w", k.ID, api.ErrKernelNotFound)
	}
	return json.Marshal(map[string]any{"kernel_id": k.ID, "before": nb.GPUMemoryBytes, "processes": len(nb.Processes)})
}

// takeChildrenBefore hands over, once, the figures ChildrenBefore kept for
// k, when they are recent.
func (d *Daemon) takeChildrenBefore(k api.KernelRef) (attribution.Notebook, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ks, ok := d.kernels[k.ConnectionFile]
	if !ok || ks.id != k.ID || ks.childrenBeforeAt.IsZero() {
		return attribution.Notebook{}, false
	}
	nb, at := ks.childrenBefore, ks.childrenBeforeAt
	ks.childrenBefore, ks.childrenBeforeAt = attribution.Notebook{}, time.Time{}
	return nb, time.Since(at) < childrenBeforeTTL
}

// notebookOf is the report's entry of the kernel of connFile (a kernel id
// may name several kernels; the file names one).
func notebookOf(rep attribution.Report, connFile string) (attribution.Notebook, bool) {
	for _, nb := range rep.Notebooks {
		if nb.ConnectionFile == connFile {
			return nb, true
		}
	}
	return attribution.Notebook{}, false
}

// argvOf is the command line recorded for pid in the kernel's tree.
func argvOf(recorded map[procID]recordedProc, pid int) string {
	for id, rec := range recorded {
		if id.PID == pid {
			return rec.Argv
		}
	}
	return ""
}

func total(per []attribution.GPUBytes) (sum uint64) {
	for _, g := range per {
		sum += g.Bytes
	}
	return sum
}

func subSat(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

func nonNilOutcomes(o []magics.ChildOutcome) []magics.ChildOutcome {
	if o == nil {
		return []magics.ChildOutcome{}
	}
	return o
}
