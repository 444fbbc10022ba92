package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/metrics"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// gpuBytesByPID sums each process's memory over all GPUs of snap. A process
// listed with unknown memory holds some: it counts, with 0 bytes.
func gpuBytesByPID(snap nvml.Snapshot) map[int]uint64 {
	out := map[int]uint64{}
	for _, dev := range snap.Devices {
		for _, p := range dev.Processes {
			b := out[p.PID]
			if p.UsedKnown {
				b += p.UsedBytes
			}
			out[p.PID] = b
		}
	}
	return out
}

// sample reads NVML and /proc once: it records each live kernel's tree,
// retires kernel processes that have exited (reclaiming their trees),
// rebuilds the report, and raises alerts.
func (d *Daemon) sample(ctx context.Context) {
	start := time.Now()
	snap, err := d.gpus.Sample(ctx)
	if err != nil {
		d.log.Warn().Err(err).Msg("sampling GPUs failed")
		d.mu.Lock()
		d.last.SampleSuccess = false
		d.mu.Unlock()
		return
	}
	want := map[int]bool{}
	for pid := range gpuBytesByPID(snap) {
		want[pid] = true
	}
	d.mu.Lock()
	for _, ks := range d.kernels {
		if !ks.cur.isZero() {
			want[ks.cur.PID] = true
		}
	}
	d.mu.Unlock()
	details := make([]int, 0, len(want))
	for pid := range want {
		details = append(details, pid)
	}
	table, err := d.fs.ScanTree(details)
	if err != nil {
		d.log.Warn().Err(err).Msg("reading /proc failed")
		return
	}

	type job struct {
		ks       *kernelState
		recorded map[procID]recordedProc
		why      string
	}
	var jobs []job
	var unknown []*kernelState
	d.mu.Lock()
	kernels := make([]attribution.Kernel, 0, len(d.kernels))
	for file, ks := range d.kernels {
		if !ks.cur.isZero() && !ks.observe(table) {
			// The kernel process is gone: its old tree's survivors are
			// orphans. With the file still there a new process serves it
			// (a restart); without, the kernel was shut down.
			why := "restart"
			if ks.fileGone {
				why = "shutdown"
				delete(d.kernels, file)
			}
			d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Int("pid", ks.cur.PID).
				Str("after", why).Msg("kernel process exited")
			jobs = append(jobs, job{ks, ks.takeRecordedLocked(), why})
			ks.cur = procID{}
			if ks.fileGone {
				continue
			}
		}
		if ks.cur.isZero() {
			unknown = append(unknown, ks)
		}
		kernels = append(kernels, attribution.Kernel{ID: ks.id, Notebook: ks.notebook, PID: ks.cur.PID, StartTime: ks.cur.Start})
	}
	d.mu.Unlock()

	for _, j := range jobs {
		d.startReclaim(ctx, j.ks, j.recorded, j.why)
	}
	if len(unknown) > 0 {
		d.resolveKernelProcesses(ctx, unknown)
	}

	rep := attribution.Attribute(snap, table, kernels)
	attribution.AddPods(&rep, table, d.cfg.Pods)
	elapsed := time.Since(start)
	d.mu.Lock()
	attached := 0
	for _, ks := range d.kernels {
		if ks.client != nil {
			attached++
		}
	}
	d.last = metrics.Snapshot{Report: rep, AttachedKernels: attached, SampleDuration: elapsed,
		SampleSuccess: true, SampledAt: time.Now(), AlertThreshold: d.cfg.AlertThreshold}
	d.mu.Unlock()
	d.checkAlerts(rep)
}

// resolveKernelProcesses finds the process of kernels whose process is not
// known (new, or restarted). Only a proven one is taken (see
// discovery.ProcFinder.FindKernels); a port owner that runs as the file's
// owner but names the file nowhere (a wrapper passing it otherwise) is
// taken once it answers a request signed with the file's key.
func (d *Daemon) resolveKernelProcesses(ctx context.Context, kss []*kernelState) {
	var files []discovery.KernelFile
	byName := map[string]*kernelState{}
	d.mu.Lock()
	for _, ks := range kss {
		if ks.client == nil || ks.proving {
			continue
		}
		if info := ks.client.Info(); info.Transport == "tcp" {
			name := filepath.Base(ks.connFile)
			files = append(files, discovery.KernelFile{Name: name, Path: ks.connFile, IP: info.IP,
				ShellPort: info.ShellPort, UID: ks.fileUID, ID: ks.fileID})
			byName[name] = ks
		}
	}
	d.mu.Unlock()
	if len(files) == 0 {
		return
	}
	owners, err := d.finder.FindKernels(files)
	if err != nil {
		d.log.Debug().Err(err).Msg("resolving kernel processes")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, o := range owners {
		ks := byName[name]
		switch {
		case ks == nil || !o.FromPort:
		case o.Proven:
			d.setKernelProcessLocked(ks, procID{o.PID, o.Start})
		case o.UIDMatch && ks.client != nil:
			ks.proving = true
			d.wg.Add(1)
			go func() { defer d.wg.Done(); d.proveByKey(ctx, ks, ks.client, procID{o.PID, o.Start}) }()
		default:
			d.problem(fmt.Errorf("kernel connection file %s: not counted as a kernel: %s", ks.connFile, o.Why))
		}
	}
}

// proveByKey takes id as ks's process when the kernel answers kernel_info
// (on control: answered even while a cell runs) with a reply signed with the
// file's key, and id still owns the port afterwards.
func (d *Daemon) proveByKey(ctx context.Context, ks *kernelState, c *protocol.Client, id procID) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := c.KernelInfo(rctx)
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	ks.proving = false
	if err != nil {
		d.problem(fmt.Errorf("kernel connection file %s: pid %d serves its port but names it nowhere, "+
			"and no reply signed with its key came (%v): not counted as a kernel", ks.connFile, id.PID, err))
		return
	}
	d.log.Info().Str("kernel_id", ks.id).Int("pid", id.PID).Msg("kernel process proven by a reply signed with its key")
	d.setKernelProcessLocked(ks, id)
}

// checkAlerts logs once when a GPU crosses the alert threshold, and again
// when it falls back below it, and keeps the notebook alert file current.
func (d *Daemon) checkAlerts(rep attribution.Report) {
	if d.cfg.AlertThreshold <= 0 {
		return
	}
	var active []notebookAlert
	for _, g := range rep.GPUs {
		over := metrics.OverThreshold(g, d.cfg.AlertThreshold)
		d.mu.Lock()
		was := d.alerted[g.Index]
		d.alerted[g.Index] = over
		if over && !was {
			d.alertEpisode[g.Index]++
		}
		episode := d.alertEpisode[g.Index]
		d.mu.Unlock()
		biggest := biggestHolders(rep, g.Index, 3)
		inNotebooks := biggest
		if d.cfg.SocketMode == api.ModeShared {
			// Every user's kernels read the alert file: name users, not
			// other users' notebooks and commands.
			inNotebooks = biggestUsers(rep, g.Index, 3)
		}
		if over && !was {
			d.log.Warn().Int("gpu", g.Index).Uint64("used_bytes", g.MemoryUsedBytes).
				Uint64("total_bytes", g.MemoryTotalBytes).Str("biggest", biggest).
				Msg("GPU memory over the alert threshold")
		} else if !over && was {
			d.log.Info().Int("gpu", g.Index).Msg("GPU memory back under the alert threshold")
		}
		if over {
			active = append(active, notebookAlert{
				ID:  fmt.Sprintf("gpu%d-%d", g.Index, episode),
				GPU: g.Index,
				Message: fmt.Sprintf("GPU %d (%s) is %.0f%% full: %s of %s used; biggest: %s. "+
					"`%%gpumem free` returns this notebook's cached memory; `%%gpumem top` shows who holds the rest.",
					g.Index, g.Name, 100*float64(g.MemoryUsedBytes)/float64(max(g.MemoryTotalBytes, 1)),
					gib(g.MemoryUsedBytes), gib(g.MemoryTotalBytes), inNotebooks),
				Kernels: kernelsOnGPU(rep, g.Index),
			})
		}
	}
	if d.cfg.NotebookAlerts {
		d.writeAlerts(active)
	}
}

// notebookAlert is one entry of the alert file the injected magics read.
type notebookAlert struct {
	ID      string   `json:"id"` // new for each crossing: shown once per kernel
	GPU     int      `json:"gpu"`
	Message string   `json:"message"`
	Kernels []string `json:"kernels"` // the kernels using that GPU
}

// alertFile is where the magics look for alerts: beside the socket.
func (d *Daemon) alertFile() string {
	return filepath.Join(filepath.Dir(d.socket), "gpumem-alerts.json")
}

// writeAlerts replaces the alert file (atomically, only when it changes).
// What was written is remembered only once the write succeeded, so a
// failed write is tried again at the next sample.
func (d *Daemon) writeAlerts(active []notebookAlert) {
	if active == nil {
		active = []notebookAlert{}
	}
	data, err := json.Marshal(map[string]any{"alerts": active})
	if err != nil {
		return
	}
	d.mu.Lock()
	same := bytes.Equal(data, d.lastAlerts)
	d.mu.Unlock()
	if same {
		return
	}
	mode := os.FileMode(0o600)
	if d.cfg.SocketMode == api.ModeShared {
		mode = 0o644 // kernels of other users read it, as they reach the socket
	}
	if err := writeFileAtomic(d.alertFile(), data, mode); err != nil {
		d.problem(fmt.Errorf("writing the notebook alert file: %w", err))
		return
	}
	d.mu.Lock()
	d.lastAlerts = data
	d.mu.Unlock()
}

// writeFileAtomic replaces path with data. The temporary file is created
// anew with a random name (O_CREAT|O_EXCL: a link planted in its place is
// never followed) and its mode is set on the descriptor, not the path.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

func kernelsOnGPU(rep attribution.Report, gpu int) []string {
	ids := []string{}
	for _, nb := range rep.Notebooks {
		for _, pg := range nb.PerGPU {
			if pg.Index == gpu && (pg.Bytes > 0 || pg.BytesUnknown) {
				ids = append(ids, nb.KernelID)
				break
			}
		}
	}
	return ids
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// biggestHolders names the n notebooks or processes holding the most on gpu.
func biggestHolders(rep attribution.Report, gpu, n int) string {
	type holder struct {
		name  string
		bytes uint64
	}
	var hs []holder
	for _, nb := range rep.Notebooks {
		for _, pg := range nb.PerGPU {
			if pg.Index == gpu && pg.Bytes > 0 {
				name := nb.Notebook
				if name == "" {
					name = "kernel " + nb.KernelID
				}
				hs = append(hs, holder{name, pg.Bytes})
			}
		}
	}
	for _, o := range rep.Other {
		for _, pg := range o.PerGPU {
			if pg.Index == gpu && pg.Bytes > 0 {
				hs = append(hs, holder{fmt.Sprintf("pid %d (%s)", o.PID, o.User), pg.Bytes})
			}
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].bytes > hs[j].bytes })
	var parts []string
	for i := 0; i < len(hs) && i < n; i++ {
		parts = append(parts, fmt.Sprintf("%s %.1f GiB", hs[i].name, float64(hs[i].bytes)/(1<<30)))
	}
	return strings.Join(parts, ", ")
}

// biggestUsers names the n users holding the most on gpu.
func biggestUsers(rep attribution.Report, gpu, n int) string {
	byUser := map[string]uint64{}
	add := func(user string, per []attribution.GPUBytes) {
		if user == "" {
			user = "unknown"
		}
		for _, pg := range per {
			if pg.Index == gpu {
				byUser[user] += pg.Bytes
			}
		}
	}
	for _, nb := range rep.Notebooks {
		add(nb.User, nb.PerGPU)
	}
	for _, o := range rep.Other {
		add(o.User, o.PerGPU)
	}
	users := make([]string, 0, len(byUser))
	for u, b := range byUser {
		if b > 0 {
			users = append(users, u)
		}
	}
	sort.Slice(users, func(i, j int) bool {
		if byUser[users[i]] != byUser[users[j]] {
			return byUser[users[i]] > byUser[users[j]]
		}
		return users[i] < users[j]
	})
	var parts []string
	for i := 0; i < len(users) && i < n; i++ {
		parts = append(parts, fmt.Sprintf("user %s %s", users[i], gib(byUser[users[i]])))
	}
	return strings.Join(parts, ", ")
}

// liveKernelTrees is every process in the tree of a live kernel process we
// know: never reclaimed.
func (d *Daemon) liveKernelTreesLocked(table *procs.Table) map[procID]bool {
	keep := map[procID]bool{}
	for _, ks := range d.kernels {
		if ks.cur.isZero() {
			continue
		}
		for _, p := range table.KernelProcesses(ks.cur.PID, ks.cur.Start) {
			keep[procID{p.PID, p.StartTime}] = true
		}
	}
	return keep
}
