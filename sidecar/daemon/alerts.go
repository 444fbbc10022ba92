package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Alerts: when a GPU's used memory passes --alert-threshold, a log line on
// the crossing and on the way back, and the notebook alert file that the
// injected magics read before each cell (each alert shown once per
// kernel). The alerts and their text are the report's
// (attribution.Finish); in shared mode they name users, never other users'
// notebooks.

// logCrossings logs once when a GPU crosses the alert threshold (naming
// its biggest holders), and again when it falls back below it.
func (d *Daemon) logCrossings(rep attribution.Report, crossed map[int]bool) {
	for _, g := range rep.GPUs {
		over, ok := crossed[g.Index]
		switch {
		case !ok:
		case over:
			var biggest []string
			for _, h := range g.Holders[:min(len(g.Holders), 3)] {
				biggest = append(biggest, h.Name+" "+units.Bytes(h.Bytes))
			}
			d.log.Warn().Int("gpu", g.Index).Uint64("used_bytes", g.MemoryUsedBytes).
				Uint64("total_bytes", g.MemoryTotalBytes).Str("biggest", strings.Join(biggest, ", ")).
				Msg("GPU memory over the alert threshold")
		default:
			d.log.Info().Int("gpu", g.Index).Msg("GPU memory back under the alert threshold")
		}
	}
}

// notebookAlert is one entry of the alert file the injected magics read:
// what a kernel of any user may read of an alert.
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
func (d *Daemon) writeAlerts(alerts []attribution.Alert) error {
	active := []notebookAlert{}
	for _, a := range alerts {
		if a.InNotebook() {
			active = append(active, notebookAlert{ID: a.ID, GPU: a.GPU, Message: a.Message, Kernels: a.Kernels})
		}
	}
	data, err := json.Marshal(map[string]any{"alerts": active})
	if err != nil {
		return fmt.Errorf("encoding the notebook alert file: %w", err)
	}
	d.mu.Lock()
	same := bytes.Equal(data, d.lastAlerts)
	d.mu.Unlock()
	if same {
		return nil
	}
	mode := os.FileMode(0o600)
	if d.cfg.SocketMode == api.ModeShared {
		mode = 0o644 // kernels of other users read it, as they reach the socket
	}
	if err := writeFileAtomic(d.alertFile(), data, mode); err != nil {
		err = fmt.Errorf("writing the notebook alert file: %w", err)
		d.problem(err)
		return err
	}
	d.mu.Lock()
	d.lastAlerts = data
	d.mu.Unlock()
	return nil
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
