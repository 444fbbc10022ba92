package api

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// EndOrphansRequest is the optional body of POST
// /api/v1/kernels/{id}/orphans/end: which processes left running to end;
// none named means all of the kernel's.
type EndOrphansRequest struct {
	PIDs []int `json:"pids,omitempty"`
}

const maxEndPIDs = 1024

// Validate rejects pids that name no process.
func (r EndOrphansRequest) Validate() error {
	if len(r.PIDs) > maxEndPIDs {
		return fmt.Errorf("end request names %d processes, at most %d are allowed", len(r.PIDs), maxEndPIDs)
	}
	for _, pid := range r.PIDs {
		if pid <= 0 {
			return fmt.Errorf("end request: %d is not a process id", pid)
		}
	}
	return nil
}

// EndOrphansReply says what was done to each process asked for.
type EndOrphansReply struct {
	KernelID  string         `json:"kernel_id"`
	Processes []EndedProcess `json:"processes"`
}

// EndedProcess is one process left running, and whether it was ended.
type EndedProcess struct {
	PID   int    `json:"pid"`
	Ended bool   `json:"ended"`
	Bytes uint64 `json:"bytes"`
	// Killed: it ignored SIGTERM and got SIGKILL after the grace.
	Killed bool `json:"killed,omitempty"`
	// Reason says why it was not ended.
	Reason string `json:"reason,omitempty"`
}

func (s *Server) serveEndOrphans(w http.ResponseWriter, r *http.Request, c caller) {
	id := c.kernel.ID
	var req EndOrphansRequest
	if status, err := (jsonBody{limit: maxFreeBody, optional: true, strict: true}).decode(w, r, &req); err != nil {
		s.writeError(w, r, status, "end request "+err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		s.writeError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	// A user ends only what the daemon recorded as theirs; an admin, any.
	user := ""
	if c.role == roleUser {
		user = c.user
	}
	reply, err := s.backend.EndOrphans(r.Context(), c.kernel, user, req)
	if s.backendError(w, r, err, "this daemon leaves no process running") {
		return
	}
	s.log.Warn().Str("kernel_id", id).Str("connection_file", c.kernel.ConnectionFile).Int("pid", c.peer.PID).Uint32("uid", c.peer.UID).Int("processes", len(reply.Processes)).
		Msg("processes left running: end asked")
	s.writeJSON(w, r, http.StatusOK, reply)
}

// orphanKernels are the kernels whose processes left running a caller may
// name: the report's notebooks, and each kernel shut down since whose
// processes reclaim left running, as an entry of its connection file whose
// user is those processes' recorded owner (none when they are of several
// users: then only an admin may end them).
func orphanKernels(rep attribution.Report) []attribution.Notebook {
	out := slices.Clone(rep.Notebooks)
	live := map[string]bool{}
	for _, nb := range rep.Notebooks {
		live[nb.ConnectionFile] = true
	}
	gone := map[string]int{} // connection file → its index in out
	for _, lr := range rep.LeftRunning {
		if live[lr.ConnectionFile] {
			continue
		}
		i, ok := gone[lr.ConnectionFile]
		if !ok {
			gone[lr.ConnectionFile] = len(out)
			out = append(out, attribution.Notebook{KernelID: lr.KernelID, ConnectionFile: lr.ConnectionFile,
				Notebook: lr.Notebook, User: lr.User})
			continue
		}
		if out[i].User != lr.User {
			out[i].User = ""
		}
	}
	return out
}
