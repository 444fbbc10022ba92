package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

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

func (s *Server) serveAddSnapshot(w http.ResponseWriter, r *http.Request, c caller) {
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
	info, err := s.backend.AddSnapshot(r.Context(), k, c.peer.UID, req)
	if s.notServed(w, r, err, noSnapshots) {
		return
	}
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
	list, err := s.backend.Snapshots(r.Context(), c.kernel)
	if s.backendError(w, r, err, noSnapshots) {
		return
	}
	if list == nil {
		list = []SnapshotInfo{}
	}
	s.writeJSON(w, r, http.StatusOK, SnapshotsResponse{Snapshots: list})
}

func (s *Server) serveSnapshot(w http.ResponseWriter, r *http.Request, c caller) {
	info, red, err := s.backend.MemorySnapshot(r.Context(), c.kernel, r.PathValue("sid"))
	if s.backendError(w, r, err, noSnapshots) {
		return
	}
	if red == nil {
		red = json.RawMessage("null")
	}
	s.writeJSON(w, r, http.StatusOK, SnapshotResponse{Snapshot: info, Reduction: red})
}

func (s *Server) serveSnapshotFile(w http.ResponseWriter, r *http.Request, c caller) {
	f, info, err := s.backend.SnapshotFile(r.Context(), c.kernel, r.PathValue("sid"))
	if s.backendError(w, r, err, noSnapshots) {
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="gpumem-snapshot-%s.pickle"`, info.ID))
	setNoCache(w)
	http.ServeContent(w, r, "", time.Unix(info.Time, 0), f)
}

// noSnapshots is the answer of a backend that keeps no snapshots.
const noSnapshots = "this daemon keeps no memory snapshots"
