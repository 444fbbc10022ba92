package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/history"
)

// HistoryQuery is GET /api/v1/history's parameters.
type HistoryQuery struct {
	Since       int64  // since=: unix seconds; 0 = the last 15 minutes
	EventsAfter uint64 // events_after=: a sequence number
	// Wait (wait=1): when no sample is as new as Since yet, answer after the
	// next one (or a few intervals at most). A client that polls this way
	// sees each sample as soon as it is taken, at one request a sample.
	Wait bool
}

// HistoryResponse is the reply of GET /api/v1/history.
type HistoryResponse struct {
	// Now is the daemon's clock (unix seconds); ask for since=Now next time.
	Now int64 `json:"now"`
	// StepSeconds is the spacing of the points returned: the sampling
	// interval for the last 15 minutes, 60 for older ranges.
	StepSeconds    int64   `json:"step_seconds"`
	AlertThreshold float64 `json:"alert_threshold"`
	// GPUs' series are keyed by GPU index, notebooks' by kernel id (and
	// ConnectionFile, the kernel's identity): per notebook one series of
	// its total (no gpu) and one of its bytes on each GPU it used (gpu:
	// that GPU's index).
	GPUs      []HistorySeries `json:"gpus"`
	Notebooks []HistorySeries `json:"notebooks"`
	// NotebookSM are the notebooks' SM utilization series: points
	// [unix seconds, percent summed over the notebook's GPUs]; a gap where
	// it was unknown.
	NotebookSM []HistorySeries `json:"notebook_sm"`
	// Events after the events_after asked for, oldest first; LastEvent is
	// the sequence number to ask after next time.
	Events    []history.Event    `json:"events"`
	LastEvent uint64             `json:"last_event"`
	Report    attribution.Report `json:"report"`
	// Users are the other users' totals, for a caller who may not see their
	// notebooks (shared mode); absent for admins, whose Report has them all.
	Users []UserUsage `json:"users,omitempty"`
	// Others, when the request names its kernels (kernels=: a Jupyter
	// server's), totals per user everything else the caller may see:
	// what JupyterLab's panel lists as everyone else.
	Others []UserUsage `json:"others,omitempty"`
}

// HistorySeries is one series' points, [unix seconds, bytes] each.
type HistorySeries struct {
	ID             string `json:"id"`
	ConnectionFile string `json:"connection_file,omitempty"`
	// GPU is the GPU's index of a notebook's series on one GPU; nil for a
	// notebook's total and for a GPU's own series.
	GPU    *int        `json:"gpu,omitempty"`
	Peak   uint64      `json:"peak_bytes"`
	PeakAt int64       `json:"peak_at"`
	Points [][2]uint64 `json:"points"`
}

func (s *Server) serveHistory(w http.ResponseWriter, r *http.Request, c caller) {
	q := r.URL.Query()
	var hq HistoryQuery
	var err error
	if v := q.Get("since"); v != "" {
		if hq.Since, err = strconv.ParseInt(v, 10, 64); err != nil {
			s.writeError(w, r, http.StatusBadRequest, fmt.Sprintf("since=%q is not a time in unix seconds", v))
			return
		}
	}
	if v := q.Get("events_after"); v != "" {
		if hq.EventsAfter, err = strconv.ParseUint(v, 10, 64); err != nil {
			s.writeError(w, r, http.StatusBadRequest, fmt.Sprintf("events_after=%q is not an event sequence number", v))
			return
		}
	}
	hq.Wait = q.Get("wait") == "1"
	resp, err := s.backend.History(r.Context(), hq)
	if s.notServed(w, r, err, "this daemon keeps no history") {
		return
	}
	if err != nil {
		s.writeError(w, r, http.StatusServiceUnavailable, fmt.Sprintf("history: %v", err))
		return
	}
	if c.role == roleUser {
		resp = userHistory(resp, c.user)
	}
	if q.Has("kernels") {
		own := map[string]bool{}
		for _, id := range strings.Split(q.Get("kernels"), ",") {
			if id != "" {
				own[id] = true
			}
		}
		resp.Others = attribution.EveryoneElse(resp.Report, own, resp.Users)
	}
	s.writeJSON(w, r, http.StatusOK, resp)
}

// userHistory is what a user who is not an admin may see of the history:
// their own notebooks, series and events, the GPUs, and every other user
// only as a total (as GET /api/v1/users gives).
func userHistory(resp HistoryResponse, user string) HistoryResponse {
	for _, u := range usersOf(resp.Report) {
		if u.User != user {
			resp.Users = append(resp.Users, u)
		}
	}
	resp.Report = ownView(resp.Report, user)
	// By connection file: another user's kernel may share an id.
	own := map[string]bool{}
	for _, nb := range resp.Report.Notebooks {
		own[nb.ConnectionFile] = true
	}
	ownSeries := func(all []HistorySeries) []HistorySeries {
		series := []HistorySeries{}
		for _, sr := range all {
			if own[sr.ConnectionFile] {
				series = append(series, sr)
			}
		}
		return series
	}
	resp.Notebooks, resp.NotebookSM = ownSeries(resp.Notebooks), ownSeries(resp.NotebookSM)
	events := []history.Event{}
	for _, e := range resp.Events {
		// A kernel shut down since is in no notebook of the report: its
		// events (the daemon names their user) are still its user's.
		if own[e.ConnectionFile] || (e.User != "" && e.User == user) {
			if e.OOM != nil { // other users' holders as user and bytes only
				v := e.OOM.For(user)
				e.OOM = &v
			}
			events = append(events, e)
		}
	}
	resp.Events = events
	return resp
}

// serveKernelVars is %gpumem vars's data of a kernel.
func (s *Server) serveKernelVars(w http.ResponseWriter, r *http.Request, c caller) {
	s.kernelQuery(w, r, c, func(ctx context.Context, k KernelRef) (json.RawMessage, error) {
		return s.backend.KernelVars(ctx, k, r.URL.Query().Get("all_devices") == "1")
	})
}

// serveKernelSummary is %gpumem's data of a kernel.
func (s *Server) serveKernelSummary(w http.ResponseWriter, r *http.Request, c caller) {
	s.kernelQuery(w, r, c, s.backend.KernelSummary)
}

// kernelQuery answers a read-only query of one kernel with f's JSON.
func (s *Server) kernelQuery(w http.ResponseWriter, r *http.Request, c caller, f func(context.Context, KernelRef) (json.RawMessage, error)) {
	reply, err := f(r.Context(), c.kernel)
	switch {
	case errors.Is(err, ErrNotServed):
		s.writeError(w, r, http.StatusNotFound, "this daemon answers no kernel queries")
		return
	case errors.Is(err, ErrKernelNotFound):
		s.writeError(w, r, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, context.DeadlineExceeded):
		s.writeError(w, r, http.StatusGatewayTimeout, err.Error())
		return
	case err != nil:
		s.writeError(w, r, http.StatusBadGateway, fmt.Sprintf("kernel %s: %v", c.kernel.ID, err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	setNoCache(w)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(reply)
}
