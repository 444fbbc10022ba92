package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/textsafe"
)

// What one caller can make the daemon spend. In shared mode every local
// user may call the API, and the daemon runs as root: no caller may make it
// hold unbounded memory, write unbounded log or starve another caller.
//
// Requests in flight are bounded per uid, never in total, so that one
// user's flood leaves every other user's calls (their kernels' own among
// them) their full share. A user's limit leaves room for what a user runs
// at once: a free waits for its kernel's running cell (up to maxFreeWait),
// so a few may be pending beside the panel's polls and a kernel's own
// calls. Admins (root, the daemon's user) serve many users' tools.
const (
	maxInFlightUser  = 16
	maxInFlightAdmin = 64
)

// A refused or failed request is logged at most logBurst times per uid
// per logWindow; the rest are counted, and the count logged once the
// window ends. What the caller sent appears in a line only as a prefix,
// sanitised (textsafe): a line is a few hundred bytes, so a flood writes
// a few KiB of log a minute per uid.
const (
	logBurst      = 5
	logWindow     = time.Minute
	maxLoggedPath = 64
	maxLoggedMsg  = 200
)

// inFlight counts the requests each uid has in flight.
type inFlight struct {
	mu sync.Mutex
	n  map[uint32]int
}

// acquire takes one of uid's limit slots; false when all are taken. Each
// true is paired with a release.
func (f *inFlight) acquire(uid uint32, limit int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == nil {
		f.n = map[uint32]int{}
	}
	if f.n[uid] >= limit {
		return false
	}
	f.n[uid]++
	return true
}

func (f *inFlight) release(uid uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[uid]--; f.n[uid] <= 0 {
		delete(f.n, uid) // the map holds only the uids with requests in flight
	}
}

// limited admits a request to h if its caller's uid has a slot left, and
// answers 429 otherwise, before reading anything of the request but its
// header.
func (s *Server) limited(w http.ResponseWriter, r *http.Request, peer Peer, h http.Handler) {
	limit := maxInFlightUser
	if peer.UID == 0 || peer.UID == s.daemonUID {
		limit = maxInFlightAdmin
	}
	if !s.inFlight.acquire(peer.UID, limit) {
		w.Header().Set("Retry-After", "1")
		s.writeError(w, r, http.StatusTooManyRequests, fmt.Sprintf("uid %d already has %d requests in flight to gpumem serve, "+
			"the most one user may have: wait for them to end (a free waits for its kernel's running cell) and try again", peer.UID, limit))
		return
	}
	defer s.inFlight.release(peer.UID)
	h.ServeHTTP(w, r)
}

// refusalLog bounds the log lines of refused and failed requests per uid.
type refusalLog struct {
	mu    sync.Mutex
	now   func() time.Time
	peers map[uint32]*peerLines
}

// peerLines is one uid's lines in its current window.
type peerLines struct {
	since   time.Time
	logged  int
	dropped int
}

// allow says whether a line for uid may be written now. When it says no
// for the first time in a window it writes why; the count of the lines
// dropped in a window is written when the window ends (at a later line of
// any uid, or at flush).
func (l *refusalLog) allow(log zerolog.Logger, uid uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	l.sweepLocked(log, now)
	if l.peers == nil {
		l.peers = map[uint32]*peerLines{}
	}
	p := l.peers[uid]
	if p == nil {
		p = &peerLines{since: now}
		l.peers[uid] = p
	}
	if p.logged < logBurst {
		p.logged++
		return true
	}
	if p.dropped == 0 {
		log.Warn().Uint32("uid", uid).Int("logged", p.logged).Time("until", p.since.Add(logWindow)).
			Msg("this uid's refused or failed API requests are counted, not logged, until the end of this minute")
	}
	p.dropped++
	return false
}

// sweepLocked ends the windows that are over, writing their counts.
func (l *refusalLog) sweepLocked(log zerolog.Logger, now time.Time) {
	for uid, p := range l.peers {
		if now.Sub(p.since) >= logWindow {
			l.summaryLocked(log, uid, p)
			delete(l.peers, uid)
		}
	}
}

func (l *refusalLog) summaryLocked(log zerolog.Logger, uid uint32, p *peerLines) {
	if p.dropped == 0 {
		return
	}
	log.Warn().Uint32("uid", uid).Int("dropped", p.dropped).Int("logged", p.logged).Time("since", p.since).
		Msg("refused or failed API requests of this uid were counted, not logged")
}

// flush writes the counts of every window with lines dropped (at the end
// of Serve).
func (l *refusalLog) flush(log zerolog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for uid, p := range l.peers {
		l.summaryLocked(log, uid, p)
		delete(l.peers, uid)
	}
}

// writeError answers an error, and logs it (rate-limited per uid, with
// only capped, sanitised prefixes of what the caller sent).
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	ev := s.log.Debug()
	if status == http.StatusForbidden || status == http.StatusTooManyRequests {
		ev = s.log.Warn()
	} else if status >= 500 {
		ev = s.log.Error()
	}
	if ev.Enabled() {
		s.logError(ev, r, status, msg)
	}
	body, _ := json.Marshal(errorBody{Error: msg}) // a struct of one string always encodes
	s.writeBody(w, status, append(body, '\n'))
}

func (s *Server) logError(ev *zerolog.Event, r *http.Request, status int, msg string) {
	pr, ok := r.Context().Value(peerKey{}).(peerResult)
	known := ok && pr.err == nil
	uid := ^uint32(0) // callers of unknown credentials share one budget
	if known {
		uid = pr.peer.UID
	}
	if !s.refusals.allow(s.log, uid) {
		ev.Discard()
		return
	}
	ev = ev.Str("method", logPrefix(r.Method, 16)).Str("path", logPrefix(r.URL.Path, maxLoggedPath)).Int("status", status)
	if known {
		ev = ev.Int("pid", pr.peer.PID).Uint32("uid", pr.peer.UID)
	}
	// Messages of other client errors may quote the request body: they go
	// to the caller only.
	if status == http.StatusForbidden || status == http.StatusTooManyRequests || status >= 500 {
		ev.Msg(logPrefix(msg, maxLoggedMsg))
	} else {
		ev.Msg(http.StatusText(status))
	}
}

// logPrefix is at most max bytes of s, shown safely (textsafe): cut before
// it is escaped, so that a long input costs no more than a short one.
func logPrefix(s string, max int) string {
	return textsafe.Cut(textsafe.Line(textsafe.Cut(s, max)), max)
}
