package metrics

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/internal/syncutil"
	"github.com/gpumem/gpumem/internal/units"
)

// ErrNonLoopback is matched by Listen's error for an address that is not
// loopback when non-loopback addresses were not allowed.
var ErrNonLoopback = errors.New("not a loopback address")

const (
	shutdownTimeout = 5 * time.Second
	readTimeout     = 10 * time.Second
)

// Server serves a handler over TCP, rejecting foreign Host headers when it
// listens on loopback.
type Server struct {
	ln        net.Listener
	hs        *http.Server
	conns     sync.WaitGroup
	closeOnce sync.Once
}

// Listen binds addr for handler. An address that is not loopback
// (127.0.0.0/8, ::1, "localhost") is refused unless allowNonLoopback; the
// address actually bound is checked too. On loopback, requests whose Host is
// not local (localhost, 127.0.0.0/8 or [::1], any port) get 403: a web page
// that rebinds its own name to 127.0.0.1 must not read the metrics (which
// name notebooks and users). On a non-loopback address (allowed) the Host is
// not checked: the metrics are then meant to be read from elsewhere.
//
// Serve must follow, or Close.
func Listen(ctx context.Context, addr string, allowNonLoopback bool, handler http.Handler, logger zerolog.Logger) (*Server, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %q: %w (want HOST:PORT, e.g. 127.0.0.1:9400)", addr, err)
	}
	if !allowNonLoopback && !isLoopbackName(host) {
		return nil, fmt.Errorf("refusing to serve metrics on %s: %w; use 127.0.0.1:PORT or [::1]:PORT, or allow non-loopback addresses explicitly", addr, ErrNonLoopback)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	bound := ln.Addr().(*net.TCPAddr)
	onLoopback := bound.IP.IsLoopback()
	if !allowNonLoopback && !onLoopback {
		_ = ln.Close()
		return nil, fmt.Errorf("refusing to serve metrics on %s (bound %s): %w", addr, bound, ErrNonLoopback)
	}
	if onLoopback {
		handler = localHostOnly(handler)
	}
	s := &Server{ln: ln}
	s.hs = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      time.Minute,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(logger.With().Str("component", "metrics_http").Logger(), "", 0),
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				s.conns.Add(1)
			case http.StateClosed, http.StateHijacked:
				s.conns.Done()
			}
		},
	}
	return s, nil
}

// Addr is the address bound (with the real port when addr had port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until ctx is done, then shuts down and returns after every
// connection's goroutine has ended. It returns nil after a shutdown caused by ctx.
func (s *Server) Serve(ctx context.Context) error {
	s.hs.BaseContext = func(net.Listener) context.Context { return ctx }
	served := make(chan error, 1)
	go func() { served <- s.hs.Serve(s.ln) }()
	var err error
	select {
	case err = <-served:
		_ = s.hs.Close()
		err = fmt.Errorf("serve metrics on %s: %w", s.ln.Addr(), err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		if serr := s.hs.Shutdown(sctx); serr != nil {
			_ = s.hs.Close()
		}
		cancel()
		<-served
	}
	_ = s.Close()
	if !syncutil.WaitTimeout(&s.conns, shutdownTimeout) && err == nil {
		err = fmt.Errorf("metrics server on %s: connections still open %s after shutdown", s.ln.Addr(), units.Duration(shutdownTimeout))
	}
	return err
}

// Close closes the listener of a Server that is not serving. Serve calls it.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if cerr := s.ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = cerr
		}
	})
	return err
}

// isLoopbackName reports whether a listen host is loopback without DNS:
// "localhost" or a loopback IP literal. "" (every interface) is not.
func isLoopbackName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// localHost reports whether a Host header names this machine's loopback:
// localhost, 127.0.0.0/8 or [::1], with or without a port.
func localHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if host == "" {
		return false
	}
	return isLoopbackName(host)
}

// localHostOnly refuses requests whose Host is not local (DNS rebinding).
func localHostOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !localHost(r.Host) {
			http.Error(w, fmt.Sprintf("host %q is not local: gpumem serves metrics to localhost only", r.Host), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
