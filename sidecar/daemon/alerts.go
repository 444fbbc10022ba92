package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/metrics"
)

// Alerts: when a GPU's used memory passes --alert-threshold, a log line on
// the crossing and on the way back, and the notebook alert file that the
// injected magics read before each cell (each crossing shown once per
// kernel). In shared mode the file names users, never other users'
// notebooks.

// checkAlerts logs once when a GPU crosses the alert threshold, and again
// when it falls back below it, and keeps the notebook alert file current.
func (d *Daemon) checkAlerts(rep attribution.Report, culls []notebookAlert) {
	active := culls
	for _, g := range rep.GPUs {
		if d.cfg.AlertThreshold <= 0 {
			break
		}
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
					units.Bytes(g.MemoryUsedBytes), units.Bytes(g.MemoryTotalBytes), inNotebooks),
				Kernels: kernelsOnGPU(rep, g.Index),
			})
		}
	}
	if d.cfg.NotebookAlerts && (d.cfg.AlertThreshold > 0 || d.cfg.Cull.Enabled()) {
		d.writeAlerts(active)
	}
}

// notebookAlert is one entry of the alert file the injected magics read.
type notebookAlert struct {
	ID      string   `json:"id"`  // new for each crossing: shown once per kernel
	GPU     int      `json:"gpu"` // -1 for a kernel's own alert (a cull warning)
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
//
// Its error names path and the step, never the temporary name: a failure
// that repeats (a full disk) must read the same each time, or the
// once-per-problemEvery limit on warnings never matches.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return atomicWriteError(path, "create a temporary file beside it", err)
	}
	tmp := f.Name()
	step := "write"
	_, err = f.Write(data)
	if err == nil {
		step, err = "chmod", f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil && cerr != nil {
		step, err = "close", cerr
	}
	if err == nil {
		step, err = "rename into place", os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return atomicWriteError(path, step, err)
	}
	return nil
}

// atomicWriteError is writeFileAtomic's error: path, the step, and the
// system's reason without the (random) name it was given with.
func atomicWriteError(path, step string, err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		err = pe.Err
	case errors.As(err, &le):
		err = le.Err
	}
	return fmt.Errorf("%s: %s: %w", path, step, err)
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
		parts = append(parts, hs[i].name+" "+units.Bytes(hs[i].bytes))
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
		parts = append(parts, fmt.Sprintf("user %s %s", users[i], units.Bytes(byUser[users[i]])))
	}
	return strings.Join(parts, ", ")
}
