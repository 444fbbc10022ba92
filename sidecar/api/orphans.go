package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// OrphanBackend ends, on request, the processes of a dead kernel's tree
// that reclaim left running (they were computing on a GPU). A Backend that
// does not implement it answers 404 there.
type OrphanBackend interface {
	// EndOrphans ends the processes left running of kernelID (those of
	// req.PIDs, or all), each checked as reclaim checks (the recorded tree,
	// pid and start time through a pidfd, the user, no live kernel's
	// tree). The error wraps ErrKernelNotFound when none is left running.
	EndOrphans(ctx context.Context, kernelID string, req EndOrphansRequest) (EndOrphansReply, error)
}

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

func (s *Server) orphanRoutes(route func(string, access, func(http.ResponseWriter, *http.Request, caller)), allow map[string]string) {
	route("POST /api/v1/kernels/{id}/orphans/end", accessOwnKernel, s.serveEndOrphans)
	allow["/api/v1/kernels/{id}/orphans/end"] = "POST"
}

func (s *Server) serveEndOrphans(w http.ResponseWriter, r *http.Request, c caller) {
	ob, ok := s.backend.(OrphanBackend)
	if !ok {
		s.writeError(w, r, http.StatusNotFound, "this daemon leaves no process running")
		return
	}
	id := r.PathValue("id")
	var req EndOrphansRequest
	if status, err := decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, status, "end request "+err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		s.writeError(w, r, http.StatusBadRequest, err.Error())
		return
	}
	reply, err := ob.EndOrphans(r.Context(), id, req)
	switch {
	case errors.Is(err, ErrKernelNotFound):
		s.writeError(w, r, http.StatusNotFound, err.Error())
		return
	case err != nil:
		s.writeError(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.log.Warn().Str("kernel_id", id).Int("pid", c.peer.PID).Uint32("uid", c.peer.UID).Int("processes", len(reply.Processes)).
		Msg("processes left running: end asked")
	s.writeJSON(w, r, http.StatusOK, reply)
}

// decodeBody reads an optional JSON body into v (no body: v unchanged):
// a body needs Content-Type application/json, which a browser cannot send
// without a preflight this API never answers; unknown fields are errors.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) (int, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFreeBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return http.StatusRequestEntityTooLarge, fmt.Errorf("body is over %d bytes", maxFreeBody)
		}
		return http.StatusBadRequest, fmt.Errorf("body could not be read: %w", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return 0, nil
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return http.StatusUnsupportedMediaType, errors.New("body must have Content-Type application/json")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return http.StatusBadRequest, fmt.Errorf("body: %w", err)
	}
	if dec.More() {
		return http.StatusBadRequest, errors.New("body: trailing data after the JSON object")
	}
	return 0, nil
}
