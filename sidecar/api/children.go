package api

import (
	"context"
	"fmt"
	"net/http"
)

// FreeChildrenRequest is the optional body of POST
// /api/v1/kernels/{id}/children/free. Without pids the daemon ends only
// the kernel's idle GPU-holding workers (reclaim's policy): a worker that
// computes, or whose work is unknown, is left running and named in the
// reply. PIDs confirms ending those processes whatever they compute, and
// only them; each must still be a process of the kernel's own recorded
// tree (pid and start time, its user, its pod): confirming widens nothing.
type FreeChildrenRequest struct {
	PIDs []int `json:"pids,omitempty"`
}

// maxConfirmPIDs bounds the pids one request confirms: a kernel's
// workers, never a host's processes.
const maxConfirmPIDs = 1024

// Validate rejects pids that name no process, a repeated pid and a list
// longer than maxConfirmPIDs.
func (r FreeChildrenRequest) Validate() error {
	if len(r.PIDs) > maxConfirmPIDs {
		return fmt.Errorf("free --children request names %d processes, at most %d are allowed", len(r.PIDs), maxConfirmPIDs)
	}
	seen := make(map[int]bool, len(r.PIDs))
	for _, pid := range r.PIDs {
		if pid <= 0 {
			return fmt.Errorf("free --children request: %d is not a process id", pid)
		}
		if seen[pid] {
			return fmt.Errorf("free --children request: pid %d is named twice", pid)
		}
		seen[pid] = true
	}
	return nil
}

func (s *Server) serveFreeChildren(w http.ResponseWriter, r *http.Request, c caller) {
	id := c.kernel.ID
	var req FreeChildrenRequest
	if status, err := (jsonBody{limit: maxFreeBody, optional: true, strict: true}).decode(w, r, &req); err != nil {
		s.writeError(w, r, status, "free --children request "+err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		s.writeError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	fromKernel := s.fromKernel(r, c)
	ctx, cancel := context.WithTimeout(r.Context(), maxFreeWait)
	defer cancel()
	reply, err := s.backend.FreeChildren(ctx, c.kernel, fromKernel, req)
	if s.notServed(w, r, err, "this daemon cannot end a kernel's workers") {
		return
	}
	if err == nil {
		s.log.Info().Str("kernel_id", id).Str("connection_file", c.kernel.ConnectionFile).Int("pid", c.peer.PID).
			Uint32("uid", c.peer.UID).Bool("from_kernel", fromKernel).Ints("confirmed_pids", req.PIDs).
			Msg("ended a kernel's worker processes on request")
	}
	s.writeKernelReply(w, r, id, reply, err)
}
