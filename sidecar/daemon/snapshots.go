package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/history"
	"github.com/gpumem/gpumem/sidecar/snapshot"
)

// What the daemon keeps of memory snapshots: the last few, each with its
// file open (for the raw download, whatever happens to the path) and its
// reduction; one reduced at a time.
const (
	maxSnapshots     = 8
	maxSnapshotBytes = 8 << 30
	reduceTimeout    = 5 * time.Minute
	// A kernel hands over at most this many snapshots a minute.
	snapshotBurst = 6
)

type snapshotEntry struct {
	info      api.SnapshotInfo
	file      *os.File
	reduction []byte
}

// snapshotStore is the daemon's snapshots. Its mutex is its own.
type snapshotStore struct {
	mu      sync.Mutex
	next    int
	entries []*snapshotEntry
	recent  map[string][]time.Time // by connection file
	reduce  chan struct{}          // one reduction at a time
}

func newSnapshotStore() *snapshotStore {
	return &snapshotStore{recent: map[string][]time.Time{}, reduce: make(chan struct{}, 1)}
}

// AddSnapshot implements api.Backend: the file is opened now (the
// caller's own regular file, no symlink on the way) and reduced in the
// background; a "snapshot" event tells JupyterLab when it is ready.
func (a apiBackend) AddSnapshot(ctx context.Context, k api.KernelRef, uid uint32, req api.SnapshotRequest) (api.SnapshotInfo, error) {
	d := a.d
	st := d.snapshots
	kernelID := k.ID
	now := time.Now()
	st.mu.Lock()
	keep := st.recent[k.ConnectionFile][:0]
	for _, t := range st.recent[k.ConnectionFile] {
		if now.Sub(t) < time.Minute {
			keep = append(keep, t)
		}
	}
	if len(keep) >= snapshotBurst {
		st.recent[k.ConnectionFile] = keep
		st.mu.Unlock()
		return api.SnapshotInfo{}, fmt.Errorf("kernel %s handed over %d snapshots in the last minute: %w", kernelID, len(keep), api.ErrTooMany)
	}
	st.recent[k.ConnectionFile] = append(keep, now)
	st.mu.Unlock()

	f, _, err := safefile.OpenOwned(req.Path, uid, maxSnapshotBytes)
	if err != nil {
		d.log.Warn().Err(err).Str("kernel_id", kernelID).Str("connection_file", k.ConnectionFile).Uint32("uid", uid).Msg("memory snapshot refused")
		if uid != 0 && uid != d.selfUID {
			// Another user learns nothing of files not theirs: not whether
			// one exists, nor whose it is.
			return api.SnapshotInfo{}, fmt.Errorf("snapshot of kernel %s: %s is not a regular file of yours of at most %d bytes "+
				"reached through no symlink", kernelID, req.Path, int64(maxSnapshotBytes))
		}
		return api.SnapshotInfo{}, fmt.Errorf("snapshot of kernel %s: %w", kernelID, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", req.Path, err)
	}
	notebook, user := k.Notebook.Notebook, k.Notebook.User
	st.mu.Lock()
	st.next++
	e := &snapshotEntry{file: f, info: api.SnapshotInfo{ID: "s" + strconv.Itoa(st.next), KernelID: kernelID, ConnectionFile: k.ConnectionFile,
		Notebook: notebook, User: user, Time: now.Unix(), Reason: req.Reason, OOMEvent: req.OOMEvent, Bytes: fi.Size(), Status: "reducing"}}
	st.entries = append(st.entries, e)
	var dropped []*snapshotEntry
	if len(st.entries) > maxSnapshots {
		dropped = append(dropped, st.entries[:len(st.entries)-maxSnapshots]...)
		st.entries = append([]*snapshotEntry(nil), st.entries[len(st.entries)-maxSnapshots:]...)
	}
	info := e.info
	st.mu.Unlock()
	for _, old := range dropped {
		_ = old.file.Close() // a download in flight gets an error; the reduction reads its own section
	}
	d.log.Info().Str("kernel_id", kernelID).Str("notebook", notebook).Str("snapshot", info.ID).Int64("bytes", info.Bytes).
		Str("reason", req.Reason).Msg("memory snapshot handed over")
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.reduceSnapshot(d.runContext, e)
	}()
	return info, nil
}

// reduceSnapshot reduces e's file, after any reduction before it, within
// reduceTimeout, and says so in the event log.
func (d *Daemon) reduceSnapshot(ctx context.Context, e *snapshotEntry) {
	st := d.snapshots
	select {
	case st.reduce <- struct{}{}:
	case <-ctx.Done():
		d.finishSnapshot(e, nil, 0, ctx.Err())
		return
	}
	defer func() { <-st.reduce }()
	ctx, cancel := context.WithTimeout(ctx, reduceTimeout)
	defer cancel()
	start := time.Now()
	r := &ctxReader{ctx: ctx, r: io.NewSectionReader(e.file, 0, e.info.Bytes)}
	red, err := snapshot.Reduce(r, snapshot.DefaultLimits)
	var body []byte
	if err == nil {
		body, err = json.Marshal(red)
	}
	d.finishSnapshot(e, body, time.Since(start), err)
}

func (d *Daemon) finishSnapshot(e *snapshotEntry, body []byte, took time.Duration, err error) {
	st := d.snapshots
	st.mu.Lock()
	e.reduction = body
	e.info.ReduceSeconds = took.Seconds()
	if err != nil {
		e.info.Status, e.info.Error = "failed", err.Error()
	} else {
		e.info.Status = "ready"
	}
	info := e.info
	st.mu.Unlock()
	log := d.log.With().Str("kernel_id", info.KernelID).Str("snapshot", info.ID).Logger()
	if err != nil {
		log.Warn().Err(err).Msg("memory snapshot not reduced")
	} else {
		log.Info().Dur("took", took).Int("json_bytes", len(body)).Msg("memory snapshot reduced")
	}
	d.hist.events.Add(history.Event{Time: time.Now().Unix(), Kind: "snapshot", KernelID: info.KernelID, ConnectionFile: info.ConnectionFile,
		Notebook: info.Notebook, User: info.User, Reason: info.ID, Bytes: uint64(info.Bytes)})
}

// Snapshots implements api.Backend: those of k's connection file.
func (a apiBackend) Snapshots(ctx context.Context, k api.KernelRef) ([]api.SnapshotInfo, error) {
	d := a.d
	st := d.snapshots
	st.mu.Lock()
	defer st.mu.Unlock()
	out := []api.SnapshotInfo{}
	for _, e := range st.entries {
		if e.info.ConnectionFile == k.ConnectionFile {
			out = append(out, e.info)
		}
	}
	return out, nil
}

// snapshotEntry is snapshot id of k's connection file (never another
// kernel's of the same id).
func (d *Daemon) snapshotEntry(k api.KernelRef, id string) (*snapshotEntry, api.SnapshotInfo, []byte, error) {
	st := d.snapshots
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, e := range st.entries {
		if e.info.ID == id && e.info.ConnectionFile == k.ConnectionFile {
			return e, e.info, e.reduction, nil
		}
	}
	return nil, api.SnapshotInfo{}, nil, fmt.Errorf("snapshot %s of kernel %s (the daemon keeps the last %d): %w", id, k.ID, maxSnapshots, api.ErrKernelNotFound)
}

// MemorySnapshot implements api.Backend.
func (a apiBackend) MemorySnapshot(ctx context.Context, k api.KernelRef, id string) (api.SnapshotInfo, json.RawMessage, error) {
	d := a.d
	_, info, red, err := d.snapshotEntry(k, id)
	return info, red, err
}

// SnapshotFile implements api.Backend: a reader of its own over
// the file kept open.
func (a apiBackend) SnapshotFile(ctx context.Context, k api.KernelRef, id string) (io.ReadSeeker, api.SnapshotInfo, error) {
	d := a.d
	e, info, _, err := d.snapshotEntry(k, id)
	if err != nil {
		return nil, info, err
	}
	return io.NewSectionReader(e.file, 0, info.Bytes), info, nil
}

// closeSnapshots closes the kept files (Run's end).
func (d *Daemon) closeSnapshots() {
	st := d.snapshots
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, e := range st.entries {
		_ = e.file.Close()
	}
	st.entries = nil
}

// ctxReader stops a long read when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, fmt.Errorf("reduction stopped: %w", err)
	}
	return c.r.Read(p)
}
