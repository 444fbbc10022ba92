package daemon

import (
	"context"
	"encoding/json"
	"errors"
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

// What the daemon keeps of memory snapshots: per user the last few, each
// with its file open (for the raw download, whatever happens to the path)
// and its reduction; each user's reduced one at a time, apart from other
// users'. A snapshot is a user's file: every bound below holds whatever it
// holds, and one user's snapshots never evict or delay another's.
const (
	// maxSnapshotsPerUser are kept per uid; a user's next evicts their
	// oldest (and stops its reduction).
	maxSnapshotsPerUser = 8
	// maxSnapshotBytes bounds a snapshot file: 128 MiB is about 950,000
	// trace entries as torch writes them (%gpumem record keeps 100,000 by
	// default: about 14 MB), which the reader's 64 MiB hold.
	maxSnapshotBytes = 128 << 20
	// maxReductionBytes bounds one reduction's JSON (900,000 trace
	// entries reduce to 135 KB; 8 GPUs of 2,000 segments each would take
	// a few MB), maxKeptPerUser all of a user's: past it their oldest go.
	maxReductionBytes = 8 << 20
	maxKeptPerUser    = 32 << 20
	reduceTimeout     = 2 * time.Minute
	// A kernel hands over at most this many snapshots a minute.
	snapshotBurst = 6
)

type snapshotEntry struct {
	info      api.SnapshotInfo
	uid       uint32
	file      *os.File
	reduction []byte
	ctx       context.Context // ends when the entry is evicted or the daemon stops
	cancel    context.CancelFunc
}

// reduceFunc reduces a snapshot pickle (snapshot.Reduce within its
// default limits; tests put a stand-in).
type reduceFunc func(ctx context.Context, r io.Reader) (*snapshot.Reduction, error)

// snapshotStore is the daemon's snapshots. Its mutex is its own.
type snapshotStore struct {
	mu      sync.Mutex
	next    int
	entries []*snapshotEntry
	recent  map[string][]time.Time   // by connection file
	slots   map[uint32]chan struct{} // per uid: one reduction at a time
	reduce  reduceFunc
}

func newSnapshotStore() *snapshotStore {
	return &snapshotStore{recent: map[string][]time.Time{}, slots: map[uint32]chan struct{}{},
		reduce: func(ctx context.Context, r io.Reader) (*snapshot.Reduction, error) {
			return snapshot.Reduce(ctx, r, snapshot.DefaultLimits)
		}}
}

// AddSnapshot implements api.Backend: the file is opened now (the
// caller's own regular file, no symlink on the way) and reduced in the
// background; a "snapshot" event tells JupyterLab when it is ready.
func (a apiBackend) AddSnapshot(ctx context.Context, k api.KernelRef, uid uint32, req api.SnapshotRequest) (api.SnapshotInfo, error) {
	d := a.d
	st := d.snapshots
	kernelID := k.ID
	now := time.Now()
	if n, ok := st.admit(k.ConnectionFile, now); !ok {
		return api.SnapshotInfo{}, fmt.Errorf("kernel %s handed over %d snapshots in the last minute: %w", kernelID, n, api.ErrTooMany)
	}
	f, err := d.openSnapshot(k, uid, req.Path)
	if err != nil {
		return api.SnapshotInfo{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return api.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w", req.Path, err)
	}
	notebook, user := k.Notebook.Notebook, k.Notebook.User
	e := &snapshotEntry{file: f, uid: uid, info: api.SnapshotInfo{KernelID: kernelID, ConnectionFile: k.ConnectionFile,
		Notebook: notebook, User: user, Time: now.Unix(), Reason: req.Reason, OOMEvent: req.OOMEvent, Bytes: fi.Size(), Status: "reducing"}}
	e.ctx, e.cancel = context.WithCancel(d.runContext)
	st.mu.Lock()
	st.next++
	e.info.ID = "s" + strconv.Itoa(st.next)
	st.entries = append(st.entries, e)
	dropped := st.evictLocked(uid, e)
	info := e.info
	st.mu.Unlock()
	dropEntries(dropped)
	d.log.Info().Str("kernel_id", kernelID).Str("notebook", notebook).Str("snapshot", info.ID).Int64("bytes", info.Bytes).
		Uint32("uid", uid).Str("reason", req.Reason).Msg("memory snapshot handed over")
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.reduceSnapshot(e)
	}()
	return info, nil
}

// admit counts a handover of the kernel of connFile: false, with the
// count, past snapshotBurst in the last minute.
func (st *snapshotStore) admit(connFile string, now time.Time) (int, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	keep := st.recent[connFile][:0]
	for _, t := range st.recent[connFile] {
		if now.Sub(t) < time.Minute {
			keep = append(keep, t)
		}
	}
	if len(keep) >= snapshotBurst {
		st.recent[connFile] = keep
		return len(keep), false
	}
	st.recent[connFile] = append(keep, now)
	return 0, true
}

// openSnapshot opens the caller's file at path, within maxSnapshotBytes.
func (d *Daemon) openSnapshot(k api.KernelRef, uid uint32, path string) (*os.File, error) {
	f, _, err := safefile.OpenOwned(path, uid, maxSnapshotBytes)
	if err == nil {
		return f, nil
	}
	d.log.Warn().Err(err).Str("kernel_id", k.ID).Str("connection_file", k.ConnectionFile).Uint32("uid", uid).Msg("memory snapshot refused")
	if errors.Is(err, safefile.ErrTooLarge) { // checked after the owner: the file is the caller's
		return nil, fmt.Errorf("snapshot of kernel %s: %s is over the %d MiB gpumem reduces: record fewer entries "+
			"(%%gpumem record on --max-entries N) or open the file in pytorch.org/memory_viz", k.ID, path, maxSnapshotBytes>>20)
	}
	if uid != 0 && uid != d.selfUID {
		// Another user learns nothing of files not theirs: not whether
		// one exists, nor whose it is.
		return nil, fmt.Errorf("snapshot of kernel %s: %s is not a regular file of yours reached through no symlink", k.ID, path)
	}
	return nil, fmt.Errorf("snapshot of kernel %s: %w", k.ID, err)
}

// evictLocked takes out uid's oldest entries past maxSnapshotsPerUser
// or maxKeptPerUser (never keep, nor another user's) and returns them.
func (st *snapshotStore) evictLocked(uid uint32, keep *snapshotEntry) []*snapshotEntry {
	count, kept := 0, 0
	for _, e := range st.entries {
		if e.uid == uid {
			count, kept = count+1, kept+len(e.reduction)
		}
	}
	var dropped []*snapshotEntry
	out := st.entries[:0]
	for _, e := range st.entries {
		if e.uid == uid && e != keep && (count > maxSnapshotsPerUser || kept > maxKeptPerUser) {
			dropped = append(dropped, e)
			count, kept = count-1, kept-len(e.reduction)
			continue
		}
		out = append(out, e)
	}
	clear(st.entries[len(out):])
	st.entries = out
	return dropped
}

// dropEntries stops the reductions of entries taken out and closes their
// files (a download in flight gets an error; a reduction reads its own
// section, and stops).
func dropEntries(entries []*snapshotEntry) {
	for _, e := range entries {
		e.cancel()
		_ = e.file.Close()
	}
}

// reduceSnapshot reduces e's file, after the reductions of its user's
// before it, within reduceTimeout, and says so in the event log.
func (d *Daemon) reduceSnapshot(e *snapshotEntry) {
	st := d.snapshots
	st.mu.Lock()
	slot := st.slots[e.uid]
	if slot == nil {
		slot = make(chan struct{}, 1)
		st.slots[e.uid] = slot
	}
	st.mu.Unlock()
	select {
	case slot <- struct{}{}:
	case <-e.ctx.Done():
		d.finishSnapshot(e, nil, 0, reduceError(e, e.ctx.Err()))
		return
	}
	defer func() { <-slot }()
	ctx, cancel := context.WithTimeout(e.ctx, reduceTimeout)
	defer cancel()
	start := time.Now()
	red, err := st.reduce(ctx, io.NewSectionReader(e.file, 0, e.info.Bytes))
	var body []byte
	if err == nil {
		body, err = json.Marshal(red)
	}
	if err == nil && len(body) > maxReductionBytes {
		err = fmt.Errorf("its reduction is %d MiB of JSON, over the %d MiB the daemon keeps: %w", len(body)>>20, maxReductionBytes>>20, snapshot.ErrLimit)
		body = nil
	}
	d.finishSnapshot(e, body, time.Since(start), reduceError(e, err))
}

// reduceError says what a failed reduction's user can do.
func reduceError(e *snapshotEntry, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("snapshot %s took longer than %v to reduce (the daemon's bound): open its raw file in pytorch.org/memory_viz, "+
			"or record fewer entries (%%gpumem record on --max-entries N)", e.info.ID, reduceTimeout)
	case e.ctx.Err() != nil:
		return fmt.Errorf("snapshot %s was not reduced: the daemon stopped, or dropped it for a newer one of its user's (it keeps %d a user)",
			e.info.ID, maxSnapshotsPerUser)
	case errors.Is(err, snapshot.ErrLimit):
		return fmt.Errorf("snapshot %s (%d bytes) is past what gpumem reduces: %w; open its raw file in pytorch.org/memory_viz, "+
			"or record fewer entries (%%gpumem record on --max-entries N)", e.info.ID, e.info.Bytes, err)
	}
	return err
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
	dropEntries(st.evictLocked(e.uid, e))
	st.mu.Unlock()
	log := d.log.With().Str("kernel_id", info.KernelID).Str("snapshot", info.ID).Uint32("uid", e.uid).Logger()
	if err != nil {
		log.Warn().Err(err).Dur("took", took).Msg("memory snapshot not reduced")
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
	return nil, api.SnapshotInfo{}, nil, fmt.Errorf("snapshot %s of kernel %s (the daemon keeps the last %d of each user): %w", id, k.ID, maxSnapshotsPerUser, api.ErrKernelNotFound)
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
	dropEntries(st.entries)
	st.entries = nil
}
