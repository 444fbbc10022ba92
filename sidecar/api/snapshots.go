package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// SnapshotBackend keeps the PyTorch memory snapshots kernels hand over and
// their reductions. A Backend that does not implement it answers 404 on
// the snapshot endpoints.
type SnapshotBackend interface {
	// AddSnapshot takes the snapshot file of kernel k (the caller, of uid,
	// is one of its processes) and starts reducing it.
	AddSnapshot(ctx context.Context, k KernelRef, uid uint32, req SnapshotRequest) (SnapshotInfo, error)
	// Snapshots lists the snapshots of k's connection file, oldest first.
	Snapshots(ctx context.Context, k KernelRef) ([]SnapshotInfo, error)
	// MemorySnapshot is one of them and, once reduced, its reduction's JSON.
	// Errors wrap ErrKernelNotFound for an unknown kernel or snapshot.
	MemorySnapshot(ctx context.Context, k KernelRef, id string) (SnapshotInfo, json.RawMessage, error)
	// SnapshotFile is the raw pickle, to download.
	SnapshotFile(ctx context.Context, k KernelRef, id string) (io.ReadSeeker, SnapshotInfo, error)
}

// SnapshotRequest is the body of POST /api/v1/snapshots.
type SnapshotRequest struct {
	// Path is the pickle's absolute path, with no symlink in it; the file
	// must belong to the caller's uid.
	Path string `json:"path"`
	// Reason is "manual" (%gpumem snapshot) or "oom" (an out-of-memory
	// error while recording); OOMEvent is then that error's event.
	Reason   string `json:"reason"`
	OOMEvent uint64 `json:"oom_event,omitempty"`
}

// SnapshotInfo describes one snapshot.
type SnapshotInfo struct {
	ID       string `json:"id"`
	KernelID string `json:"kernel_id"`
	// ConnectionFile is the kernel's identity: a snapshot is its kernel's
	// by file, never by id.
	ConnectionFile string `json:"connection_file"`
	Notebook       string `json:"notebook"`
	User           string `json:"user"`
	Time           int64  `json:"time"`
	Reason         string `json:"reason"`
	OOMEvent       uint64 `json:"oom_event,omitempty"`
	Bytes          int64  `json:"bytes"`
	// Status is "reducing", "ready" or "failed" (Error says why).
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// ReduceSeconds is how long the reduction took.
	ReduceSeconds float64 `json:"reduce_seconds,omitempty"`
}

// SnapshotResponse is the reply of GET /api/v1/kernels/{id}/snapshots/{sid}.
type SnapshotResponse struct {
	Snapshot  SnapshotInfo    `json:"snapshot"`
	Reduction json.RawMessage `json:"reduction"` // null until ready
}

// SnapshotsResponse is the reply of GET /api/v1/kernels/{id}/snapshots.
type SnapshotsResponse struct {
	Snapshots []SnapshotInfo `json:"snapshots"`
}

const maxSnapshotBody = 8 << 10

func (s *Server) snapshotRoutes(route func(string, access, func(http.ResponseWriter, *http.Request, caller)), allow map[string]string) {
	route("POST /api/v1/snapshots", accessAnyone, s.serveAddSnapshot)
	route("GET /api/v1/kernels/{id}/snapshots", accessOwnKernel, s.serveSnapshots)
	route("GET /api/v1/kernels/{id}/snapshots/{sid}", accessOwnKernel, s.serveSnapshot)
	route("GET /api/v1/kernels/{id}/snapshots/{sid}/raw", accessOwnKernel, s.serveSnapshotFile)
	allow["/api/v1/snapshots"] = "POST"
	allow["/api/v1/kernels/{id}/snapshots"] = "GET, HEAD"
	allow["/api/v1/kernels/{id}/snapshots/{sid}"] = "GET, HEAD"
	allow["/api/v1/kernels/{id}/snapshots/{sid}/raw"] = "GET, HEAD"
}

func (s *Server) snapshotBackend(w http.ResponseWriter, r *http.Request) (SnapshotBackend, bool) {
	sb, ok := s.backend.(SnapshotBackend)
	if !ok {
		s.writeError(w, r, http.StatusNotFound, "this daemon keeps no memory snapshots")
	}
	return sb, ok
}

func (s *Server) serveAddSnapshot(w http.ResponseWriter, r *http.Request, c caller) {
	sb, ok := s.snapshotBackend(w, r)
	if !ok {
		return
	}
	k, err := s.callerKernel(r.Context(), c)
	if err != nil {
		s.writeCallerKernelError(w, r, err)
		return
	}
	var req SnapshotRequest
	if status, err := (jsonBody{limit: maxSnapshotBody}).decode(w, r, &req); err != nil {
		s.writeError(w, r, status, "snapshot: "+err.Error())
		return
	}
	if req.Reason != "manual" && req.Reason != "oom" {
		s.writeError(w, r, http.StatusBadRequest, fmt.Sprintf("snapshot: reason %q: want \"manual\" or \"oom\"", req.Reason))
		return
	}
	info, err := sb.AddSnapshot(r.Context(), k, c.peer.UID, req)
	if err != nil {
		if errors.Is(err, ErrTooMany) {
			s.writeError(w, r, http.StatusTooManyRequests, err.Error())
			return
		}
		s.writeError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	s.writeJSON(w, r, http.StatusAccepted, info)
}

func (s *Server) serveSnapshots(w http.ResponseWriter, r *http.Request, c caller) {
	sb, ok := s.snapshotBackend(w, r)
	if !ok {
		return
	}
	list, err := sb.Snapshots(r.Context(), c.kernel)
	if err != nil {
		s.writeError(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	if list == nil {
		list = []SnapshotInfo{}
	}
	s.writeJSON(w, r, http.StatusOK, SnapshotsResponse{Snapshots: list})
}

func (s *Server) serveSnapshot(w http.ResponseWriter, r *http.Request, c caller) {
	sb, ok := s.snapshotBackend(w, r)
	if !ok {
		return
	}
	info, red, err := sb.MemorySnapshot(r.Context(), c.kernel, r.PathValue("sid"))
	if err != nil {
		s.snapshotError(w, r, err)
		return
	}
	if red == nil {
		red = json.RawMessage("null")
	}
	s.writeJSON(w, r, http.StatusOK, SnapshotResponse{Snapshot: info, Reduction: red})
}

func (s *Server) serveSnapshotFile(w http.ResponseWriter, r *http.Request, c caller) {
	sb, ok := s.snapshotBackend(w, r)
	if !ok {
		return
	}
	f, info, err := sb.SnapshotFile(r.Context(), c.kernel, r.PathValue("sid"))
	if err != nil {
		s.snapshotError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="gpumem-snapshot-%s.pickle"`, info.ID))
	setNoCache(w)
	http.ServeContent(w, r, "", time.Unix(info.Time, 0), f)
}

func (s *Server) snapshotError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, ErrKernelNotFound) {
		s.writeError(w, r, http.StatusNotFound, err.Error())
		return
	}
	s.writeError(w, r, http.StatusServiceUnavailable, err.Error())
}
