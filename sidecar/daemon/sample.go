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
	}
	var jobs []job
	var unknown []*kernelState
	d.mu.Lock()
	kernels := make([]attribution.Kernel, 0, len(d.kernels))
	for _, ks := range d.kernels {
		if !ks.cur.isZero() {
			if !ks.observe(table) {
				d.log.Info().Str("kernel_id", ks.id).Str("notebook", ks.notebook).Int("pid", ks.cur.PID).
					Msg("kernel process exited")
				jobs = append(jobs, job{ks, ks.takeRecordedLocked()})
				ks.cur = procID{}
			}
		}
		if ks.cur.isZero() {
			unknown = append(unknown, ks)
		}
		kernels = append(kernels, attribution.Kernel{ID: ks.id, Notebook: ks.notebook, PID: ks.cur.PID, StartTime: ks.cur.Start})
	}
	d.mu.Unlock()

	for _, j := range jobs {
		d.startReclaim(ctx, j.ks, j.recorded, "restart")
	}
	if len(unknown) > 0 {
		d.resolveKernelProcesses(unknown)
	}

	rep := attribution.Attribute(snap, table, kernels)
	sampledAt := d.recordHistory(time.Now(), &rep)
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
	d.historySampled(sampledAt)
	d.checkAlerts(rep)
}

// resolveKernelProcesses finds the process of kernels whose process is not
// known (new, or restarted): the owner of the shell port, nothing less.
func (d *Daemon) resolveKernelProcesses(kss []*kernelState) {
	var files []discovery.KernelFile
	byName := map[string]*kernelState{}
	d.mu.Lock()
	for _, ks := range kss {
		if ks.client == nil {
			continue
		}
		if info := ks.client.Info(); info.Transport == "tcp" {
			name := filepath.Base(ks.connFile)
			files = append(files, discovery.KernelFile{Name: name, ShellPort: info.ShellPort})
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
		if ks := byName[name]; ks != nil && o.FromPort {
			d.setKernelProcessLocked(ks, procID{o.PID, o.Start})
		}
	}
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
	d.lastAlerts = data
	d.mu.Unlock()
	if same {
		return
	}
	mode := os.FileMode(0o600)
	if d.cfg.SocketMode == api.ModeShared {
		mode = 0o644 // kernels of other users read it, as they reach the socket
	}
	tmp := d.alertFile() + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		d.log.Warn().Err(err).Msg("writing the notebook alert file")
		return
	}
	if err := os.Chmod(tmp, mode); err == nil {
		err = os.Rename(tmp, d.alertFile())
		if err != nil {
			d.log.Warn().Err(err).Msg("writing the notebook alert file")
		}
	}
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
