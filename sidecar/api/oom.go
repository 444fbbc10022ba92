package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/oom"
)

// ErrTooMany is wrapped by an OOMBackend's error for a kernel that reports
// more errors than any cell could raise.
var ErrTooMany = errors.New("too many reports")

// noOOMs is the answer of a backend that records no out-of-memory errors.
const noOOMs = "this daemon records no out-of-memory errors"

// OOMEventsResponse is the reply of GET /api/v1/oom.
type OOMEventsResponse struct {
	Events []oom.Event `json:"events"`
}

// callerKernel is the kernel the caller's process belongs to, for the
// endpoints where a kernel speaks for itself: the kernel is never named by
// the caller, so no kernel can speak for another. It is the kernel whose
// live tree holds the caller's SO_PEERCRED pid, by its connection file
// (KernelOfPID), and the uid must be the kernel's owner's (a pid reused
// by another user is not the kernel). Its entry is the last report's.
//
// Anyone may call these endpoints, as often as they like: a caller whose
// uid owns no kernel of the last report is refused from its credentials
// alone, before anything of /proc is read.
func (s *Server) callerKernel(ctx context.Context, c caller) (KernelRef, error) {
	if c.peer.PID <= 0 {
		return KernelRef{}, fmt.Errorf("the caller's pid is not visible to the daemon (another pid namespace): only a kernel's own process may use this endpoint")
	}
	rep, err := s.backend.Report(ctx)
	if err != nil {
		return KernelRef{}, fmt.Errorf("no GPU memory snapshot: %w", err)
	}
	user := c.user
	if c.role != roleUser {
		user = s.userName(c.peer.UID)
	}
	if !slices.ContainsFunc(rep.Notebooks, func(nb attribution.Notebook) bool { return nb.User == user }) {
		return KernelRef{}, fmt.Errorf("uid %d owns no kernel of the daemon's last sample: only a kernel's own process may use this endpoint "+
			"(a kernel that started within the last sample: try again)", c.peer.UID)
	}
	file, owner, ok := s.backend.KernelOfPID(ctx, c.peer.PID)
	if !ok || owner != c.peer.UID {
		return KernelRef{}, fmt.Errorf("pid %d (uid %d) is not a process of a kernel the daemon follows: only a kernel's own process may use this endpoint", c.peer.PID, c.peer.UID)
	}
	for _, nb := range rep.Notebooks {
		if nb.ConnectionFile == file {
			return KernelRef{ID: nb.KernelID, ConnectionFile: file, Notebook: nb}, nil
		}
	}
	return KernelRef{}, fmt.Errorf("the kernel of pid %d (connection file %s) is not in the daemon's last sample yet: try again: %w", c.peer.PID, file, ErrKernelNotFound)
}

func (s *Server) serveRecordOOM(w http.ResponseWriter, r *http.Request, c caller) {
	k, err := s.callerKernel(r.Context(), c)
	if err != nil {
		s.writeCallerKernelError(w, r, err)
		return
	}
	var req oom.Request
	if status, err := (jsonBody{limit: oom.MaxRequestBody}).decode(w, r, &req); err != nil {
		s.writeError(w, r, status, "out-of-memory report: "+err.Error())
		return
	}
	if err := req.Clean(); err != nil {
		s.writeError(w, r, http.StatusBadRequest, "out-of-memory report: "+err.Error())
		return
	}
	ev, err := s.backend.RecordOOM(r.Context(), k, req)
	if s.backendError(w, r, err, noOOMs) {
		return
	}
	if c.role == roleUser {
		ev = ev.For(c.user)
	}
	s.writeJSON(w, r, http.StatusOK, ev)
}

func (s *Server) serveOOMEvents(w http.ResponseWriter, r *http.Request, c caller) {
	evs, err := s.backend.OOMEvents(r.Context())
	if s.backendError(w, r, err, noOOMs) {
		return
	}
	out := OOMEventsResponse{Events: []oom.Event{}}
	for _, ev := range evs {
		if c.role == roleUser {
			if ev.User != c.user {
				continue
			}
			ev = ev.For(c.user)
		}
		out.Events = append(out.Events, ev)
	}
	s.writeJSON(w, r, http.StatusOK, out)
}

// writeCallerKernelError answers callerKernel's error: 404 for a kernel
// not sampled yet, 403 for a caller that is no kernel's process.
func (s *Server) writeCallerKernelError(w http.ResponseWriter, r *http.Request, err error) {
	status := http.StatusForbidden
	if errors.Is(err, ErrKernelNotFound) {
		status = http.StatusNotFound
	}
	s.writeError(w, r, status, err.Error())
}
