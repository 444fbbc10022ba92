package protocol

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// generation is one set of sockets and the goroutines that serve them.
type generation struct {
	info   ConnectionInfo
	key    []byte
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// iopub is a bare ZMTP connection, read by the supervisor itself:
	// a zmq4 socket would add two goroutines and its queues per kernel.
	iopub          *zmq4.Conn
	hb             zmq4.Socket // nil for a lean client
	shell, control *channel

	failOnce sync.Once
	failed   chan struct{}
	err      error // set before failed is closed
}

// channel is a generation's shell or control socket. A lean client dials
// it for a request and closes it once idle; otherwise it is dialed with
// the generation and lives as long.
type channel struct {
	name string // "shell" or "control"
	port int

	mu      sync.Mutex
	conn    *channelConn  // nil while not dialed
	dialing chan struct{} // closed when the dial under way ends; nil when none
	users   int           // requests using conn
	idle    *time.Timer   // closes conn when it fires with no users
	closed  bool          // the generation is closing: dial no more
}

// channelConn is one dialed socket of a channel.
type channelConn struct {
	sock   zmq4.Socket
	cancel context.CancelFunc
	// retired: closed on purpose (idle, or the generation closing), so
	// its reader's error is no sign of a lost kernel.
	retired atomic.Bool
}

func (cc *channelConn) retire() {
	cc.retired.Store(true)
	cc.cancel()
	_ = cc.sock.Close() // errors from closing dead connections tell us nothing
}

func (g *generation) fail(err error) {
	g.failOnce.Do(func() {
		g.err = err
		close(g.failed)
		// Closes every socket of the generation, iopub's included, so that
		// the supervisor's read returns.
		g.cancel()
	})
}

// close closes every socket (which unblocks their readers) and waits for
// the generation's goroutines.
func (g *generation) close() {
	g.cancel()
	for _, ch := range []*channel{g.shell, g.control} {
		ch.mu.Lock()
		ch.closed = true
		if ch.idle != nil {
			ch.idle.Stop()
		}
		if ch.conn != nil {
			ch.conn.retire()
			ch.conn = nil
		}
		ch.mu.Unlock()
	}
	// Errors from closing dead connections tell us nothing.
	if g.iopub != nil {
		_ = g.iopub.Close()
	}
	if g.hb != nil {
		_ = g.hb.Close()
	}
	g.wg.Wait()
}

var discardLogger = log.New(io.Discard, "", 0)

// connect builds one generation of sockets and attaches with kernel_info.
func (c *Client) connect(ctx context.Context, info ConnectionInfo) (*generation, KernelInfo, error) {
	gctx, gcancel := context.WithCancel(c.ctx)
	g := &generation{
		info:    info,
		key:     []byte(info.Key),
		ctx:     gctx,
		cancel:  gcancel,
		failed:  make(chan struct{}),
		shell:   &channel{name: "shell", port: info.ShellPort},
		control: &channel{name: "control", port: info.ControlPort},
	}
	// zmq4's Dial ignores contexts other than the socket's own: tie the
	// sockets to ctx while dialing.
	stop := context.AfterFunc(ctx, gcancel)
	err := c.dialSockets(ctx, g)
	if !stop() {
		g.close()
		return nil, KernelInfo{}, fmt.Errorf("dial: %w", ctx.Err())
	}
	if err != nil {
		g.close()
		return nil, KernelInfo{}, err
	}
	if g.hb != nil {
		g.wg.Add(1)
		go c.heartbeat(g)
	}

	msg, err := c.roundTripOn(ctx, g, true, "kernel_info_request", nil)
	if err != nil {
		g.close()
		return nil, KernelInfo{}, err
	}
	ki, err := parseKernelInfo(msg)
	if err != nil {
		g.close()
		return nil, KernelInfo{}, err
	}
	return g, ki, nil
}

func (c *Client) socketOptions() []zmq4.Option {
	return []zmq4.Option{
		zmq4.WithDialerMaxRetries(0), // we retry ourselves, re-reading the file
		zmq4.WithDialerTimeout(c.opts.ConnectTimeout),
		zmq4.WithTimeout(c.opts.ConnectTimeout),
		zmq4.WithLogger(discardLogger),
	}
}

// dialSockets connects a new generation: iopub, and unless the client is
// lean the heartbeat, control and shell as well.
func (c *Client) dialSockets(ctx context.Context, g *generation) error {
	opts := c.socketOptions()
	if !c.opts.Lean {
		// Heartbeat first: the cheapest way to learn that nothing listens.
		g.hb = zmq4.NewReq(context.WithValue(g.ctx, guardKey{}, c.guard), opts...)
		if err := g.hb.Dial(g.info.endpoint(g.info.HBPort)); err != nil {
			return fmt.Errorf("dial heartbeat: %w", err)
		}
		for _, ch := range []*channel{g.control, g.shell} {
			if _, err := c.acquire(ctx, g, ch); err != nil {
				return err
			}
			c.release(ch)
		}
	}
	network, addr := g.info.address(g.info.IOPubPort)
	iopub, err := openZMTP(g.ctx, c.iopubGuard, network, addr, zmq4.Sub)
	if err != nil {
		return fmt.Errorf("dial iopub: %w", err)
	}
	g.iopub = iopub
	// Until the kernel's ident is known (from its first status message),
	// subscribe to "kernel."; readIOPub then narrows to kernel.<ident>.status
	// and drops every other topic unread.
	if err := subscribe(iopub, true, "kernel."); err != nil {
		return fmt.Errorf("subscribe iopub: %w", err)
	}
	return nil
}

// acquire returns ch's socket for one request, dialing it (within ctx)
// when it is not connected. Each acquire is paired with a release. A
// request that finds another's dial under way waits for it, within its
// own ctx: the lock is never held across a dial.
func (c *Client) acquire(ctx context.Context, g *generation, ch *channel) (zmq4.Socket, error) {
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil, fmt.Errorf("%w: the connection was closed", ErrConnectionLost)
		}
		if ch.idle != nil {
			ch.idle.Stop()
			ch.idle = nil
		}
		if ch.conn != nil {
			ch.users++
			sock := ch.conn.sock
			ch.mu.Unlock()
			return sock, nil
		}
		if wait := ch.dialing; wait != nil {
			ch.mu.Unlock()
			select {
			case <-wait:
				continue // dialed or failed: look again
			case <-ctx.Done():
				return nil, fmt.Errorf("dial %s: waiting for another request's dial: %w", ch.name, ctx.Err())
			}
		}
		done := make(chan struct{})
		ch.dialing = done
		ch.mu.Unlock()
		cc, err := c.dialChannel(ctx, g, ch)
		ch.mu.Lock()
		ch.dialing = nil
		close(done)
		if err == nil && ch.closed {
			cc.retire()
			err = fmt.Errorf("%w: the connection was closed", ErrConnectionLost)
		}
		if err != nil {
			ch.mu.Unlock()
			return nil, err
		}
		ch.conn = cc
		ch.users++
		g.wg.Add(1) // before close can wait: close marks ch closed under ch.mu
		go c.readReplies(g, cc, ch.name)
		ch.mu.Unlock()
		return cc.sock, nil
	}
}

// dialChannel connects ch's socket, within ctx and the generation.
func (c *Client) dialChannel(ctx context.Context, g *generation, ch *channel) (*channelConn, error) {
	sctx, cancel := context.WithCancel(context.WithValue(g.ctx, guardKey{}, c.guard))
	sock := zmq4.NewDealer(sctx, c.socketOptions()...)
	stop := context.AfterFunc(ctx, cancel)
	err := sock.Dial(g.info.endpoint(ch.port))
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		cancel()
		_ = sock.Close()
		return nil, fmt.Errorf("dial %s: %w", ch.name, err)
	}
	return &channelConn{sock: sock, cancel: cancel}, nil
}

// release ends a request's use of ch. A lean client closes the socket
// once it has gone unused for LeanIdle.
func (c *Client) release(ch *channel) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.users--
	if !c.opts.Lean || ch.users > 0 || ch.conn == nil || ch.closed {
		return
	}
	cc := ch.conn
	ch.idle = time.AfterFunc(c.opts.LeanIdle, func() {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		if ch.conn == cc && ch.users == 0 {
			ch.conn, ch.idle = nil, nil
			cc.retire()
		}
	})
}

// isRefused reports whether err says that nothing listens at the endpoint.
func isRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// drainAfterClose empties zmq4's internal queue after the socket's context
// ended, so that none of its goroutines stays blocked on a full queue.
// Recv does not block once the context is done.
func drainAfterClose(s zmq4.Socket) {
	for range 64 {
		_, _ = s.Recv() // only emptying; the socket is closed
	}
}

func (c *Client) readReplies(g *generation, cc *channelConn, channel string) {
	defer g.wg.Done()
	for {
		zm, err := cc.sock.Recv()
		if err != nil {
			if cc.retired.Load() {
				drainAfterClose(cc.sock)
				return
			}
			g.fail(fmt.Errorf("%s channel: %w", channel, err))
			if g.ctx.Err() != nil {
				drainAfterClose(cc.sock)
			}
			return
		}
		msg, err := Decode(zm.Frames, g.key, c.limits)
		if err != nil {
			c.decodeErrors.Add(1)
			continue
		}
		c.mu.Lock()
		reply := c.pending[msg.Parent.MsgID]
		c.mu.Unlock()
		if reply != nil {
			select {
			case reply <- msg:
			default: // a second reply to one request: keep the first
			}
		}
	}
}
