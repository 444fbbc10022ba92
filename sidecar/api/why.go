package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// WhyQuery is GET /api/v1/kernels/{id}/why's parameters.
type WhyQuery struct {
	Device     *int    // device=N: only this CUDA device
	AllDevices bool    // all_devices=1: the CPU's tensors too
	Budget     float64 // budget=S: seconds the kernel may spend (0: its default)
}

// maxWhyBody bounds POST .../why's body: the why data a kernel computed
// itself. The kernel caps its rows at 40 per category (why.py's
// _ROWS_SHOWN), so the data stays small: 2 KB for a kernel of a dozen
// tensors, 67 KB measured for the largest we could make (41 rows of named
// variables and 41 of memory held elsewhere, behind referrer chains of 13
// levels of long names). 256 KiB is four times that. A body over it gets
// 413, and the kernel shows its rows without the driver's.
const maxWhyBody = 256 << 10

func (s *Server) serveWhy(w http.ResponseWriter, r *http.Request, c caller) {
	q := r.URL.Query()
	opts := WhyQuery{AllDevices: q.Get("all_devices") == "1"}
	if v := q.Get("device"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			s.writeError(w, r, http.StatusBadRequest, fmt.Sprintf("device=%q is not a CUDA device number", v))
			return
		}
		opts.Device = &n
	}
	if v := q.Get("budget"); v != "" {
		b, err := strconv.ParseFloat(v, 64)
		if err != nil || b <= 0 || b > 600 {
			s.writeError(w, r, http.StatusBadRequest, fmt.Sprintf("budget=%q is not a number of seconds between 0 and 600", v))
			return
		}
		opts.Budget = b
	}
	id := c.kernel.ID
	if s.fromKernel(r, c) {
		s.writeError(w, r, http.StatusConflict, fmt.Sprintf("kernel %s cannot answer a why query from its own running cell "+
			"(it runs after that cell): use %%gpumem why in the notebook instead", id))
		return
	}
	reply, err := s.backend.KernelWhy(r.Context(), c.kernel, opts)
	if s.notServed(w, r, err, "this daemon answers no why queries") {
		return
	}
	s.writeKernelReply(w, r, id, reply, err)
}

func (s *Server) serveWhyJoin(w http.ResponseWriter, r *http.Request, c caller) {
	var body json.RawMessage
	if status, err := (jsonBody{limit: maxWhyBody}).decode(w, r, &body); err != nil {
		s.writeError(w, r, status, "why data: "+err.Error())
		return
	}
	reply, err := s.backend.JoinWhy(r.Context(), c.kernel, body)
	if s.notServed(w, r, err, "this daemon answers no why queries") {
		return
	}
	s.writeKernelReply(w, r, c.kernel.ID, reply, err)
}

func (s *Server) serveChildrenBefore(w http.ResponseWriter, r *http.Request, c caller) {
	if !s.fromKernel(r, c) {
		s.writeError(w, r, http.StatusConflict, fmt.Sprintf("kernel %s: only the kernel's own cell asks for the figures "+
			"before its teardown; POST .../children/free runs the teardown itself", c.kernel.ID))
		return
	}
	reply, err := s.backend.ChildrenBefore(r.Context(), c.kernel)
	if s.notServed(w, r, err, "this daemon cannot end a kernel's workers") {
		return
	}
	s.writeKernelReply(w, r, c.kernel.ID, reply, err)
}

// writeKernelReply answers with a backend's JSON for a kernel, or its error.
func (s *Server) writeKernelReply(w http.ResponseWriter, r *http.Request, id string, reply json.RawMessage, err error) {
	switch {
	case errors.Is(err, ErrKernelNotFound):
		s.writeError(w, r, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrRefused):
		s.writeError(w, r, http.StatusUnprocessableEntity, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		s.writeError(w, r, http.StatusGatewayTimeout, err.Error())
	case err != nil:
		s.writeError(w, r, http.StatusBadGateway, fmt.Sprintf("kernel %s: %v", id, err))
	case !json.Valid(reply):
		s.writeError(w, r, http.StatusInternalServerError, "the daemon produced an invalid reply")
	default:
		w.Header().Set("Content-Type", "application/json")
		setNoCache(w)
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(reply)
	}
}
