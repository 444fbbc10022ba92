package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
)

// WhyBackend answers %gpumem why for a kernel. Errors follow Backend.Free's
// rules (ErrKernelNotFound: 404, ErrRefused: 422).
type WhyBackend interface {
	// KernelWhy asks the kernel for its why data, joins the driver's
	// figures and returns it rendered (text, html).
	KernelWhy(ctx context.Context, k KernelRef, q WhyQuery) (json.RawMessage, error)
	// JoinWhy joins why data the kernel computed itself with the driver's
	// figures; the kernel renders the reply.
	JoinWhy(ctx context.Context, k KernelRef, data json.RawMessage) (json.RawMessage, error)
}

// ChildrenBackend ends the GPU-holding worker processes of a live kernel,
// never the kernel. fromKernel says the request came from inside the
// kernel (the caller's process is in its tree), which has run the
// frameworks' teardown itself.
type ChildrenBackend interface {
	FreeChildren(ctx context.Context, k KernelRef, fromKernel bool) (json.RawMessage, error)
}

// WhyQuery is GET /api/v1/kernels/{id}/why's parameters.
type WhyQuery struct {
	Device     *int    // device=N: only this CUDA device
	AllDevices bool    // all_devices=1: the CPU's tensors too
	Budget     float64 // budget=S: seconds the kernel may spend (0: its default)
}

const maxWhyBody = 4 << 20

// whyRoutes adds the why and children endpoints.
func (s *Server) whyRoutes(route func(string, access, func(http.ResponseWriter, *http.Request, caller)), allow map[string]string) {
	route("GET /api/v1/kernels/{id}/why", accessOwnKernel, s.serveWhy)
	route("POST /api/v1/kernels/{id}/why", accessOwnKernel, s.serveWhyJoin)
	route("POST /api/v1/kernels/{id}/children/free", accessOwnKernel, s.serveFreeChildren)
	allow["/api/v1/kernels/{id}/why"] = "GET, HEAD, POST"
	allow["/api/v1/kernels/{id}/children/free"] = "POST"
}

func (s *Server) serveWhy(w http.ResponseWriter, r *http.Request, c caller) {
	wb, ok := s.backend.(WhyBackend)
	if !ok {
		s.writeError(w, r, http.StatusNotFound, "this daemon answers no why queries")
		return
	}
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
	reply, err := wb.KernelWhy(r.Context(), c.kernel, opts)
	s.writeKernelReply(w, r, id, reply, err)
}

func (s *Server) serveWhyJoin(w http.ResponseWriter, r *http.Request, c caller) {
	wb, ok := s.backend.(WhyBackend)
	if !ok {
		s.writeError(w, r, http.StatusNotFound, "this daemon answers no why queries")
		return
	}
	var body json.RawMessage
	if status, err := (jsonBody{limit: maxWhyBody}).decode(w, r, &body); err != nil {
		s.writeError(w, r, status, "why data: "+err.Error())
		return
	}
	reply, err := wb.JoinWhy(r.Context(), c.kernel, body)
	s.writeKernelReply(w, r, c.kernel.ID, reply, err)
}

func (s *Server) serveFreeChildren(w http.ResponseWriter, r *http.Request, c caller) {
	cb, ok := s.backend.(ChildrenBackend)
	if !ok {
		s.writeError(w, r, http.StatusNotFound, "this daemon cannot end a kernel's workers")
		return
	}
	id := c.kernel.ID
	fromKernel := s.fromKernel(r, c)
	ctx, cancel := context.WithTimeout(r.Context(), maxFreeWait)
	defer cancel()
	reply, err := cb.FreeChildren(ctx, c.kernel, fromKernel)
	if err == nil {
		s.log.Info().Str("kernel_id", id).Str("connection_file", c.kernel.ConnectionFile).Int("pid", c.peer.PID).
			Uint32("uid", c.peer.UID).Bool("from_kernel", fromKernel).Msg("ended a kernel's worker processes on request")
	}
	s.writeKernelReply(w, r, id, reply, err)
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
