package protocol

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 trusts its peer: it allocates a frame of whatever 64-bit length the
// peer announces (a panic or an out-of-memory crash for a hostile one), and
// its ZMTP handshake reads without a deadline (a stopped kernel hangs Dial
// and, with it, Close). gpumem therefore dials kernels through its own
// transports, which wrap each net.Conn in a guard that
//   - scans the ZMTP byte stream and fails the read that would deliver a
//     frame header over the limits, before zmq4 sees it;
//   - bounds the handshake and every later write with deadlines;
//   - closes the connection when the socket's context ends, so that a Dial
//     stuck in its handshake returns.
const (
	transportTCP = "gpumem+tcp"
	transportIPC = "gpumem+ipc"
)

var (
	registerOnce sync.Once
	registerErr  error
)

func registerTransports() error {
	registerOnce.Do(func() {
		for name, network := range map[string]string{transportTCP: "tcp", transportIPC: "unix"} {
			if err := zmq4.RegisterTransport(name, guardTransport{network: network}); err != nil {
				registerErr = fmt.Errorf("register zmq4 transport %s: %w", name, err)
			}
		}
	})
	return registerErr
}

// guardKey carries a *guardConfig in a socket's context to its transport.
type guardKey struct{}

type guardConfig struct {
	maxFrameBytes    uint64
	maxFrames        int
	maxMessageBytes  uint64
	handshakeTimeout time.Duration
	writeTimeout     time.Duration
	// dial opens the connection instead of zmq4's dialer (Options.Dial).
	dial DialFunc
}

func newGuardConfig(lim Limits, handshakeTimeout time.Duration, dial DialFunc) *guardConfig {
	lim = lim.withDefaults()
	return &guardConfig{
		maxFrameBytes:    uint64(lim.MaxFrameBytes),
		maxFrames:        lim.MaxFrames,
		maxMessageBytes:  uint64(lim.maxMessageBytes()),
		handshakeTimeout: handshakeTimeout,
		writeTimeout:     10 * time.Second,
		dial:             dial,
	}
}

type guardTransport struct{ network string }

func (t guardTransport) Dial(ctx context.Context, dialer transport.Dialer, addr string) (net.Conn, error) {
	cfg, _ := ctx.Value(guardKey{}).(*guardConfig)
	if cfg == nil {
		cfg = newGuardConfig(Limits{}, 5*time.Second, nil)
	}
	return cfg.open(ctx, t.network, addr, dialer.DialContext)
}

// open dials addr (through cfg.dial when set, else through dial) within
// the handshake timeout and wraps the connection in the guard, which
// closes it when ctx ends.
func (cfg *guardConfig) open(ctx context.Context, network, addr string, dial DialFunc) (net.Conn, error) {
	if cfg.dial != nil {
		dial = cfg.dial
	}
	dctx, cancel := context.WithTimeout(ctx, cfg.handshakeTimeout)
	conn, err := dial(dctx, network, addr)
	cancel()
	if err != nil {
		return nil, err
	}
	return newGuardedConn(ctx, conn, cfg), nil
}

// openZMTP connects one bare ZMTP connection of type typ to addr: the
// guard's dial and limits, zmq4's handshake and framing, but no zmq4
// socket (no goroutines, queues or reconnects of its own). The caller
// reads it; it closes when ctx ends.
func openZMTP(ctx context.Context, cfg *guardConfig, network, addr string, typ zmq4.SocketType) (*zmq4.Conn, error) {
	var d net.Dialer
	conn, err := cfg.open(ctx, network, addr, d.DialContext)
	if err != nil {
		return nil, err
	}
	zc, err := zmq4.Open(conn, null.Security(), typ, nil, false, nil)
	if err != nil {
		_ = conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return zc, nil
}

func (t guardTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("gpumem transports only dial")
}

func (t guardTransport) Addr(ep string) (string, error) {
	if t.network == "unix" {
		return ep, nil
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, port), nil
}

// handshakeTimeout is a read that timed out before the peer finished its
// ZMTP handshake: the port accepted the connection (the kernel's socket
// exists) but nothing answered on it.
type handshakeTimeout struct {
	after time.Duration
	err   error
}

func (e handshakeTimeout) Error() string {
	return fmt.Sprintf("the kernel did not answer ZMTP's handshake within its %v deadline (is it stopped or hung?): %v", e.after, e.err)
}
func (e handshakeTimeout) Unwrap() error { return e.err }
func (e handshakeTimeout) Timeout() bool { return true }

// guardedConn is a net.Conn that enforces guardConfig on a ZMTP stream.
type guardedConn struct {
	net.Conn
	cfg           *guardConfig
	scan          zmtpScanner // touched only by the reading goroutine
	readErr       error       // sticky, reading goroutine only
	handshakeDone atomic.Bool
	stopAfter     func() bool
	closeOnce     sync.Once
	closeErr      error
}

func newGuardedConn(ctx context.Context, conn net.Conn, cfg *guardConfig) *guardedConn {
	g := &guardedConn{Conn: conn, cfg: cfg, scan: newZMTPScanner(cfg)}
	if cfg.handshakeTimeout > 0 {
		_ = conn.SetDeadline(time.Now().Add(cfg.handshakeTimeout))
	}
	// The context's end closes the connection without touching stopAfter:
	// a context already done runs this at once, on another goroutine, while
	// stopAfter is still being assigned.
	g.stopAfter = context.AfterFunc(ctx, func() { _ = g.closeConn() })
	return g
}

func (g *guardedConn) Read(p []byte) (int, error) {
	if g.readErr != nil {
		return 0, g.readErr
	}
	n, err := g.Conn.Read(p)
	if err != nil && !g.handshakeDone.Load() {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// zmq4 reports this as a greeting it could not read, with an
			// "i/o timeout": say what it means for a kernel.
			err = handshakeTimeout{after: g.cfg.handshakeTimeout, err: err}
		}
	}
	if n > 0 {
		if serr := g.scan.feed(p[:n]); serr != nil {
			g.readErr = serr
			_ = g.Close()
			return 0, serr
		}
		if !g.handshakeDone.Load() && g.scan.commands > 0 {
			// The peer's READY has arrived: the handshake is over.
			g.handshakeDone.Store(true)
			_ = g.Conn.SetDeadline(time.Time{})
		}
	}
	return n, err
}

func (g *guardedConn) Write(p []byte) (int, error) {
	if g.handshakeDone.Load() && g.cfg.writeTimeout > 0 {
		_ = g.Conn.SetWriteDeadline(time.Now().Add(g.cfg.writeTimeout))
	}
	n, err := g.Conn.Write(p)
	var ne net.Error
	if err != nil && errors.As(err, &ne) && ne.Timeout() {
		// A partial frame leaves the ZMTP stream corrupt: drop the connection.
		_ = g.Close()
	}
	return n, err
}

func (g *guardedConn) Close() error {
	g.stopAfter()
	return g.closeConn()
}

func (g *guardedConn) closeConn() error {
	g.closeOnce.Do(func() { g.closeErr = g.Conn.Close() })
	return g.closeErr
}

// frameLimitError is a net.Error, so that zmq4 marks the connection closed.
type frameLimitError struct{ msg string }

func (e *frameLimitError) Error() string   { return "zmtp: " + e.msg }
func (e *frameLimitError) Timeout() bool   { return false }
func (e *frameLimitError) Temporary() bool { return false }

// ErrFrameTooLarge is wrapped by errors about frames over the limits.
var ErrFrameTooLarge = errors.New("frame over the size limit")

func (e *frameLimitError) Unwrap() error { return ErrFrameTooLarge }

// zmtpScanner follows a ZMTP 3 byte stream as it is read: the 64-byte
// greeting, then frames (flags, 1- or 8-byte size, body). It never buffers.
type zmtpScanner struct {
	cfg          *guardConfig
	greetingLeft int
	state        int
	flags        byte
	size         [8]byte
	sizeGot      int
	bodyLeft     uint64
	msgFrames    int
	msgBytes     uint64
	commands     int // complete command frames seen (READY first)
}

const (
	zmtpGreetingLen = 64
	flagMore        = 0x01
	flagLong        = 0x02
	flagCommand     = 0x04
)

const (
	stFlags = iota
	stShortSize
	stLongSize
	stBody
)

func newZMTPScanner(cfg *guardConfig) zmtpScanner {
	return zmtpScanner{cfg: cfg, greetingLeft: zmtpGreetingLen, state: stFlags}
}

func (s *zmtpScanner) feed(b []byte) error {
	for len(b) > 0 {
		if s.greetingLeft > 0 {
			n := min(s.greetingLeft, len(b))
			s.greetingLeft -= n
			b = b[n:]
			continue
		}
		switch s.state {
		case stFlags:
			s.flags = b[0]
			b = b[1:]
			s.sizeGot = 0
			if s.flags&flagLong != 0 {
				s.state = stLongSize
			} else {
				s.state = stShortSize
			}
		case stShortSize:
			size := uint64(b[0])
			b = b[1:]
			if err := s.startBody(size); err != nil {
				return err
			}
		case stLongSize:
			n := min(8-s.sizeGot, len(b))
			copy(s.size[s.sizeGot:], b[:n])
			s.sizeGot += n
			b = b[n:]
			if s.sizeGot == 8 {
				var size uint64
				for _, c := range s.size {
					size = size<<8 | uint64(c)
				}
				if err := s.startBody(size); err != nil {
					return err
				}
			}
		case stBody:
			n := uint64(len(b))
			if n > s.bodyLeft {
				n = s.bodyLeft
			}
			s.bodyLeft -= n
			b = b[n:]
			if s.bodyLeft == 0 {
				s.endFrame()
			}
		}
	}
	return nil
}

func (s *zmtpScanner) startBody(size uint64) error {
	if size > s.cfg.maxFrameBytes {
		return &frameLimitError{fmt.Sprintf("peer announced a %d-byte frame, limit %d", size, s.cfg.maxFrameBytes)}
	}
	if s.flags&flagCommand == 0 {
		if s.msgFrames+1 > s.cfg.maxFrames {
			return &frameLimitError{fmt.Sprintf("peer sent a message of more than %d frames", s.cfg.maxFrames)}
		}
		if s.msgBytes+size > s.cfg.maxMessageBytes {
			return &frameLimitError{fmt.Sprintf("peer sent a message of more than %d bytes", s.cfg.maxMessageBytes)}
		}
		s.msgFrames++
		s.msgBytes += size
	}
	s.bodyLeft = size
	s.state = stBody
	if size == 0 {
		s.endFrame()
	}
	return nil
}

func (s *zmtpScanner) endFrame() {
	s.state = stFlags
	if s.flags&flagCommand != 0 {
		s.commands++
		return
	}
	if s.flags&flagMore == 0 {
		s.msgFrames, s.msgBytes = 0, 0
	}
}
