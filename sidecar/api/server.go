package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Free deadlines. A free runs after the kernel's current cell, which may
// take hours, so the caller's own deadline normally rules; the server caps
// it. A free asked from inside the kernel itself can only be answered once
// the asking cell ends, which it never will while it waits: it gets a short
// deadline and says why.
const (
	maxFreeWait  = 30 * time.Minute
	selfFreeWait = 10 * time.Second
)

// ErrKernelNotFound is wrapped by Backend.Free's error for a kernel the
// daemon does not know; the API answers 404.
var ErrKernelNotFound = errors.New("kernel not found")

// ErrRefused is wrapped by Backend.Free's error when the kernel refused the
// request (an unknown variable, say) and changed nothing; the API answers 422.
var ErrRefused = errors.New("refused")

// Options configure a Server.
type Options struct {
	// Logger gets one line per free, and per refused or failed request up
	// to a few a minute per uid (refusalLog). Headers and bodies are never
	// logged.
	Logger zerolog.Logger
}

const (
	maxFreeBody     = 64 << 10
	shutdownTimeout = 5 * time.Second
	readTimeout     = 10 * time.Second
)

// Server serves the API on a Listener.
type Server struct {
	backend      Backend
	log          zerolog.Logger
	daemonUID    uint32
	selfFreeWait time.Duration
	userName     func(uid uint32) string
	inFlight     inFlight
	refusals     refusalLog
}

// NewServer returns a Server over backend. Admin rights go to root and to
// the process's effective uid.
func NewServer(backend Backend, opts Options) *Server {
	return &Server{backend: backend, log: opts.Logger, daemonUID: uint32(os.Geteuid()), selfFreeWait: selfFreeWait,
		userName: lookupUserName, refusals: refusalLog{now: time.Now}}
}

// Serve serves the API on ln until ctx is done, then shuts down (in-flight
// requests see ctx cancelled and get shutdownTimeout to finish), closes ln
// (removing the socket file) and returns after every connection's goroutine
// has ended. It returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context, ln *Listener) error {
	var conns sync.WaitGroup
	hs := &http.Server{
		Handler:           s.handler(ln.Mode()),
		ConnContext:       withPeer,
		BaseContext:       func(_ net.Listener) context.Context { return ctx },
		ReadHeaderTimeout: readTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(s.log.With().Str("component", "api_http").Logger(), "", 0),
		// A WaitGroup over connections: Shutdown does not wait for the
		// goroutines of the connections it closes, this does.
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				conns.Done()
			}
		},
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	var err error
	select {
	case err = <-served:
		// Serve failed on its own (the listener broke).
		_ = hs.Close()
		err = fmt.Errorf("serve %s: %w", ln.Path(), err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		if serr := hs.Shutdown(sctx); serr != nil {
			_ = hs.Close()
		}
		cancel()
		<-served // returns ErrServerClosed at once after Shutdown/Close
	}
	_ = ln.Close()
	if !syncutil.WaitTimeout(&conns, shutdownTimeout) {
		s.log.Error().Str("socket", ln.Path()).Msg("api connections still running after shutdown")
	}
	s.refusals.flush(s.log)
	return err
}

// handler is the whole API: peer check, requests in flight per uid,
// browser checks, routes.
func (s *Server) handler(mode Mode) http.Handler {
	mux := http.NewServeMux()
	for _, rt := range routes {
		mux.Handle(rt.method+" "+rt.path, s.authorized(mode, rt.access, func(w http.ResponseWriter, r *http.Request, c caller) {
			rt.serve(s, w, r, c)
		}))
	}
	allows := allowed()
	// The same paths without a method: any other method gets 405.
	for path, allow := range allows {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			s.writeError(w, r, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s: use %s", r.Method, r.URL.Path, allow))
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, http.StatusNotFound, fmt.Sprintf("no such endpoint: %s", r.URL.Path))
	})

	checked := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := checkNotBrowser(r); err != nil {
			s.writeError(w, r, http.StatusForbidden, err.Error())
			return
		}
		mux.ServeHTTP(w, r)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pr, ok := r.Context().Value(peerKey{}).(peerResult)
		if !ok || pr.err != nil {
			msg := "cannot identify the caller"
			if ok {
				msg = fmt.Sprintf("cannot identify the caller: %v", pr.err)
			}
			s.writeError(w, r, http.StatusForbidden, msg)
			return
		}
		s.limited(w, r, pr.peer, checked)
	})
}

// authorized identifies the caller and applies the access rule before h;
// for an endpoint of one kernel it picks that kernel (pickKernel) from the
// last report, so that h acts on one connection file the caller may act on.
func (s *Server) authorized(mode Mode, a access, h func(http.ResponseWriter, *http.Request, caller)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pr, _ := r.Context().Value(peerKey{}).(peerResult) // checked by handler
		c := identify(mode, s.daemonUID, pr.peer, s.userName)
		if err := authorize(mode, c, a); err != nil {
			s.writeError(w, r, http.StatusForbidden, err.Error())
			return
		}
		if a == accessOwnKernel || a == accessOwnOrphans {
			rep, ok := s.report(w, r)
			if !ok {
				return
			}
			kernels := rep.Notebooks
			if a == accessOwnOrphans {
				kernels = orphanKernels(rep)
			}
			ref, status, msg := pickKernel(c, r.PathValue("id"), r.URL.Query().Get("connection_file"), kernels)
			if status != 0 {
				s.writeError(w, r, status, msg)
				return
			}
			c.kernel = ref
		}
		h(w, r, c)
	})
}

func (s *Server) serveHealthz(w http.ResponseWriter, r *http.Request, _ caller) {
	s.writeJSON(w, r, http.StatusOK, map[string]string{"status": "ok"})
}

// report fetches the snapshot, answering 503 when there is none.
func (s *Server) report(w http.ResponseWriter, r *http.Request) (attribution.Report, bool) {
	rep, err := s.backend.Report(r.Context())
	if err != nil {
		s.writeError(w, r, http.StatusServiceUnavailable, fmt.Sprintf("no GPU memory snapshot: %v", err))
		return attribution.Report{}, false
	}
	return rep, true
}

func (s *Server) serveGPUs(w http.ResponseWriter, r *http.Request, _ caller) {
	rep, ok := s.report(w, r)
	if !ok {
		return
	}
	gpus := rep.GPUs
	if gpus == nil {
		gpus = []attribution.GPU{}
	}
	s.writeJSON(w, r, http.StatusOK, GPUsResponse{GPUs: gpus})
}

func (s *Server) serveUsers(w http.ResponseWriter, r *http.Request, _ caller) {
	rep, ok := s.report(w, r)
	if !ok {
		return
	}
	s.writeJSON(w, r, http.StatusOK, UsersResponse{Users: usersOf(rep)})
}

// usersOf is the report's per-user totals (attribution.Finish made them).
func usersOf(rep attribution.Report) []UserUsage {
	if rep.Users == nil {
		return []UserUsage{}
	}
	return rep.Users
}

func (s *Server) serveNotebooks(w http.ResponseWriter, r *http.Request, c caller) {
	if c.role != roleUser {
		body, err := s.backend.ReportJSON(r.Context())
		if errors.Is(err, ErrNotServed) {
			body, err = s.encodedReport(r.Context())
		}
		if err != nil {
			s.writeError(w, r, http.StatusServiceUnavailable, fmt.Sprintf("no GPU memory snapshot: %v", err))
			return
		}
		s.writeBody(w, http.StatusOK, body)
		return
	}
	rep, ok := s.report(w, r)
	if !ok {
		return
	}
	if c.role == roleUser {
		rep = ownView(rep, c.user)
	}
	s.writeJSON(w, r, http.StatusOK, rep)
}

// encodedReport encodes the backend's report, for one that does not
// encode it itself.
func (s *Server) encodedReport(ctx context.Context) ([]byte, error) {
	rep, err := s.backend.Report(ctx)
	if err != nil {
		return nil, err
	}
	return json.Marshal(rep)
}

func (s *Server) serveKernels(w http.ResponseWriter, r *http.Request, c caller) {
	ks, err := s.backend.Kernels(r.Context())
	if err != nil {
		s.writeError(w, r, http.StatusServiceUnavailable, fmt.Sprintf("kernels: %v", err))
		return
	}
	if c.role == roleUser { // their own kernels: what the report names theirs
		rep, ok := s.report(w, r)
		if !ok {
			return
		}
		own := map[string]bool{}
		for _, nb := range ownView(rep, c.user).Notebooks {
			own[nb.ConnectionFile] = true
		}
		mine := []KernelStatus{}
		for _, k := range ks {
			if own[k.ConnectionFile] {
				mine = append(mine, k)
			}
		}
		ks = mine
	}
	if ks == nil {
		ks = []KernelStatus{}
	}
	s.writeJSON(w, r, http.StatusOK, KernelsResponse{Kernels: ks})
}

func (s *Server) serveKernel(w http.ResponseWriter, r *http.Request, c caller) {
	if r.URL.Query().Get("fresh") == "1" {
		nb, err := s.backend.KernelNow(r.Context(), c.kernel)
		switch {
		case errors.Is(err, ErrKernelNotFound):
			s.writeError(w, r, http.StatusNotFound, err.Error())
		case err != nil:
			s.writeError(w, r, http.StatusServiceUnavailable, err.Error())
		default:
			s.writeJSON(w, r, http.StatusOK, nb)
		}
		return
	}
	s.writeJSON(w, r, http.StatusOK, c.kernel.Notebook)
}

func (s *Server) serveFree(w http.ResponseWriter, r *http.Request, c caller) {
	id := c.kernel.ID
	req, status, err := decodeFree(w, r)
	if err != nil {
		s.writeError(w, r, status, err.Error())
		return
	}
	log := s.log.With().Str("kernel_id", id).Str("connection_file", c.kernel.ConnectionFile).Int("pid", c.peer.PID).Uint32("uid", c.peer.UID).Logger()
	wait, self := maxFreeWait, false
	if s.fromKernel(r, c) {
		wait, self = s.selfFreeWait, true
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	reply, err := s.backend.Free(ctx, c.kernel, req)
	switch {
	case self && errors.Is(err, context.DeadlineExceeded):
		log.Warn().Err(err).Msg("free from inside the kernel timed out")
		s.writeError(w, r, http.StatusGatewayTimeout, fmt.Sprintf("kernel %s did not run the free within %s: "+
			"the request came from inside this kernel, whose running cell is waiting for it, and the free runs only "+
			"after that cell; use %%gpumem free in the notebook instead", id, units.Duration(s.selfFreeWait)))
		return
	case errors.Is(err, ErrKernelNotFound):
		s.writeError(w, r, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, ErrRefused):
		log.Info().Err(err).Msg("free refused")
		s.writeError(w, r, http.StatusUnprocessableEntity, err.Error())
		return
	case errors.Is(err, context.DeadlineExceeded):
		log.Warn().Err(err).Msg("free timed out")
		s.writeError(w, r, http.StatusGatewayTimeout, err.Error())
		return
	case err != nil:
		log.Error().Err(err).Msg("free failed")
		s.writeError(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	if !json.Valid(reply) {
		log.Error().Msg("free: backend returned invalid JSON")
		s.writeError(w, r, http.StatusInternalServerError, "free: the daemon produced an invalid reply")
		return
	}
	log.Info().Int("vars", len(req.Vars)).Bool("all", req.All).Msg("freed GPU memory on request")
	w.Header().Set("Content-Type", "application/json")
	setNoCache(w)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(reply)
}

// fromKernel reports whether the caller's process (SO_PEERCRED) is in the
// tree of the kernel c acts on: a request from inside that kernel. Never
// anything the request says of itself.
func (s *Server) fromKernel(r *http.Request, c caller) bool {
	file, _, ok := s.backend.KernelOfPID(r.Context(), c.peer.PID)
	return ok && file == c.kernel.ConnectionFile
}

// decodeFree reads the optional FreeRequest body: no body means cache-only.
func decodeFree(w http.ResponseWriter, r *http.Request) (FreeRequest, int, error) {
	var req FreeRequest
	if status, err := (jsonBody{limit: maxFreeBody, optional: true, strict: true}).decode(w, r, &req); err != nil {
		return req, status, fmt.Errorf("free request %w", err)
	}
	if err := req.Validate(); err != nil {
		return req, http.StatusBadRequest, err
	}
	return req, 0, nil
}

func setNoCache(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		s.writeError(w, r, http.StatusInternalServerError, fmt.Sprintf("encode reply: %v", err))
		return
	}
	s.writeBody(w, status, append(body, '\n'))
}

// writeBody sends an encoded JSON reply; one without its final newline
// gets it (written apart: body may be shared with other requests).
func (s *Server) writeBody(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	setNoCache(w)
	w.WriteHeader(status)
	_, _ = w.Write(body)
	if len(body) == 0 || body[len(body)-1] != '\n' {
		_, _ = w.Write([]byte{'\n'})
	}
}

// errorBody is every error reply.
type errorBody struct {
	Error string `json:"error"`
}
