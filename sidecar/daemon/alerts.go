package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Alerts: when a GPU's used memory passes --alert-threshold, a log line on
// the crossing and on the way back, and the notebook alert files that the
// injected magics read before each cell (each alert shown once per
// kernel). The alerts and their text are the report's
// (attribution.Finish); in shared mode they name users, never other users'
// notebooks, and each user's kernels read a file of that user's alone,
// holding what the user's view of the report holds.

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

// notebookAlert is one entry of an alert file the injected magics read:
// what the kernels reading that file may read of an alert.
type notebookAlert struct {
	ID      string   `json:"id"`  // new for each crossing: shown once per kernel
	GPU     int      `json:"gpu"` // -1 for a kernel's own alert (a cull warning)
	Message string   `json:"message"`
	Kernels []string `json:"kernels"` // the kernels using that GPU (in a user's file, theirs only)
}

// The alert files' names beside the socket: a private daemon's one file,
// and a shared daemon's dir of one file per user.
const (
	alertFileName = "gpumem-alerts.json"
	alertDirName  = "gpumem-alerts"
)

// AlertFile is the notebook alert file that gpumem serve, its socket at
// socket, writes for the kernels of uid. A shared daemon (its socket open
// to every local user) writes each user a file of their own, <uid>.json,
// readable by that user alone, in a dir of its own beside the socket: the
// alerts name kernels, and a user may see no other user's. A private
// daemon writes the one file beside the socket, for its own user.
func AlertFile(socket string, shared bool, uid uint32) string {
	dir := filepath.Dir(socket)
	if !shared {
		return filepath.Join(dir, alertFileName)
	}
	return filepath.Join(dir, alertDirName, strconv.FormatUint(uint64(uid), 10)+".json")
}

// notebookAlerts reports whether the daemon keeps the notebook alert
// files: alerts in notebooks are on, and something raises them.
func (d *Daemon) notebookAlerts() bool {
	return d.cfg.NotebookAlerts && (d.cfg.AlertThreshold > 0 || d.cfg.Cull.Enabled())
}

// alertsPerUser reports whether each user has an alert file of their own
// (a shared socket: every user's kernels read alerts).
func (d *Daemon) alertsPerUser() bool { return d.cfg.SocketMode == api.ModeShared }

// alertFile is a private daemon's one alert file.
func (d *Daemon) alertFile() string { return AlertFile(d.cfg.SocketPath, false, 0) }

// kernelAlertFile is the alert file a kernel whose process runs as uid is
// told to read.
func (d *Daemon) kernelAlertFile(uid uint32) string {
	return AlertFile(d.cfg.SocketPath, d.alertsPerUser(), uid)
}

// alertDoc encodes an alert file: the alerts shown in notebooks, and in a
// user's file (forUser) only those naming a kernel of theirs (a GPU's
// alert whose kernels are none of theirs is nothing their kernels show).
// It reports how many it holds.
func alertDoc(alerts []attribution.Alert, forUser bool) ([]byte, int, error) {
	active := []notebookAlert{}
	for _, a := range alerts {
		if a.InNotebook() && (!forUser || len(a.Kernels) > 0) {
			active = append(active, notebookAlert{ID: a.ID, GPU: a.GPU, Message: a.Message, Kernels: a.Kernels})
		}
	}
	data, err := json.Marshal(map[string]any{"alerts": active})
	if err != nil {
		return nil, 0, fmt.Errorf("encoding the notebook alert file: %w", err)
	}
	return data, len(active), nil
}

// userAlertDocs is each user's alert file (by uid, users naming each uid
// as the report names users): what attribution.AlertsFor lets that user
// see. A user whose kernels have no alert has none.
func userAlertDocs(rep attribution.Report, users map[uint32]string) (map[uint32][]byte, error) {
	docs := map[uint32][]byte{}
	for uid, name := range users {
		data, n, err := alertDoc(attribution.AlertsFor(rep, name), true)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			docs[uid] = data
		}
	}
	return docs, nil
}

// alertUsers names the uid of each kernel of rep with a file of its own to
// read, as rep names its user: the uid the kernel is told its file by (its
// connection file's owner), where its process proven to run as that uid
// is the one rep names. A pod's kernel is told no file.
func (d *Daemon) alertUsers(rep attribution.Report) map[uint32]string {
	uids := map[string]uint32{} // by connection file
	d.mu.Lock()
	for file, ks := range d.kernels {
		if ks.pod == nil && !ks.cur.isZero() && ks.uid == ks.fileUID {
			uids[file] = ks.fileUID
		}
	}
	d.mu.Unlock()
	users := map[uint32]string{}
	for _, nb := range rep.Notebooks {
		if uid, ok := uids[nb.ConnectionFile]; ok && nb.User != "" {
			users[uid] = nb.User
		}
	}
	return users
}

// writeAlerts brings the alert files up to date with rep's alerts: each
// file written anew (atomically) only when its content changes, a user's
// file removed once none of their kernels' alerts stands. What was written
// is remembered only once the write succeeded, so a failed write is tried
// again at the next sample.
func (d *Daemon) writeAlerts(rep attribution.Report) error {
	want := map[string]alertContent{}
	if d.alertsPerUser() {
		docs, err := userAlertDocs(rep, d.alertUsers(rep))
		if err != nil {
			return err
		}
		for uid, data := range docs {
			want[d.kernelAlertFile(uid)] = alertContent{data: data, owner: int(uid)}
		}
	} else {
		data, _, err := alertDoc(rep.Alerts, false)
		if err != nil {
			return err
		}
		want[d.alertFile()] = alertContent{data: data, owner: -1}
	}
	errs := d.alerts.files.sync(d.alertLayout(), want)
	for _, err := range errs {
		d.problem(err)
	}
	return errors.Join(errs...)
}

// alertLayout is where this daemon's alert files lie.
func (d *Daemon) alertLayout() alertLayout {
	l := alertLayout{private: d.alertFile(), uid: d.selfUID}
	if d.alertsPerUser() {
		l.dir = filepath.Dir(d.kernelAlertFile(0))
	}
	return l
}

// removeAlertFiles removes the alert files as the daemon stops: no kernel
// reads alerts that no longer stand.
func (d *Daemon) removeAlertFiles() {
	if !d.alertsPerUser() {
		_ = os.Remove(d.alertFile())
		return
	}
	for path := range d.alerts.files.written {
		_ = os.Remove(path)
	}
	_ = os.Remove(d.alertLayout().dir) // only if empty
}

// writeFileAtomic replaces path with data. The temporary file is created
// anew with a random name (O_CREAT|O_EXCL: a link planted in its place is
// never followed) and its mode, and its owner when owner is a uid (not
// -1), are set on the descriptor, not the path, before it takes path's
// place: no one else reads it on the way.
//
// Its error names path and the step, never the temporary name: a failure
// that repeats (a full disk) must read the same each time, or the
// once-per-problemEvery limit on warnings never matches.
func writeFileAtomic(path string, data []byte, mode os.FileMode, owner int) error {
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
	if err == nil && owner >= 0 {
		step, err = "chown to uid "+strconv.Itoa(owner), f.Chown(owner, -1)
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
