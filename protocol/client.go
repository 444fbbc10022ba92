package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/uuid"
)

// Options configures Dial. Zero values get sensible defaults.
type Options struct {
	HeartbeatInterval time.Duration // default 1s
	HeartbeatTimeout  time.Duration // per beat; default 1s. A missed beat → reconnect
	MaxFrameBytes     int64         // default 64 MiB; larger frames drop the connection
	// MaxIOPubFrameBytes bounds iopub frames, default 64 KiB. The client
	// reads only the kernel's status messages there (a few hundred bytes)
	// and drops the rest, so a kernel that floods its output cannot make
	// it hold large buffers.
	MaxIOPubFrameBytes int64
	// The client's own session id; default a fresh uuid.
	Session  string
	Username string // default "gpumem"
	// ConnectTimeout bounds one attach attempt (dial every socket, then
	// kernel_info) and each socket's dial and handshake. Default 5s.
	ConnectTimeout time.Duration
	// MaxBackoff caps the wait between reconnect attempts. Default 2s.
	MaxBackoff time.Duration
	// Dial opens the connection to each of the kernel's sockets ("tcp" or
	// "unix"); nil dials from this process's network namespace. A kernel
	// in another network namespace (a Kubernetes pod's) is reached by a
	// Dial that creates its sockets there.
	Dial DialFunc
	// ReadConnectionFile reads the connection file, at Dial and at every
	// reconnect; nil reads the path (ReadConnectionFile). A file inside
	// another mount namespace is read through a reader that resolves the
	// path within that namespace's root.
	ReadConnectionFile func(path string) (ConnectionInfo, error)
	// Lean keeps only the iopub socket connected between requests, for a
	// process that follows many kernels at once: shell and control are
	// dialed when a request needs them and closed once no request has
	// used them for LeanIdle, and no heartbeat is sent. Each connected
	// zmq4 socket costs two goroutines and buffers; lean, a kernel costs
	// one bare connection (iopub, read by the client's own goroutine)
	// instead of four sockets. A kernel that dies still closes iopub
	// (EOF), which fails the connection as a missed heartbeat would; a
	// stopped but living kernel is no longer noticed. Alive then means
	// that iopub is connected.
	Lean bool
	// LeanIdle: how long a lean client keeps an unused shell or control
	// socket. Default 10s.
	LeanIdle time.Duration
	// OnEvent, when set, receives the client's events instead of Events():
	// it is called in order on the client's own goroutine (EventConnected
	// on Dial's, before Dial returns), so a process following many
	// kernels needs no goroutine per kernel to wait for them. It must
	// return promptly, since the client reads nothing meanwhile, and must
	// not call Close, which waits for that goroutine.
	OnEvent func(Event)
}

// DialFunc opens a network connection, as net.Dialer.DialContext does.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

func (o Options) withDefaults() Options {
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.HeartbeatTimeout <= 0 {
		o.HeartbeatTimeout = time.Second
	}
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if o.MaxIOPubFrameBytes <= 0 {
		o.MaxIOPubFrameBytes = 64 << 10
	}
	if o.Session == "" {
		o.Session = uuid.NewString()
	}
	if o.Username == "" {
		o.Username = "gpumem"
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 2 * time.Second
	}
	if o.ReadConnectionFile == nil {
		o.ReadConnectionFile = ReadConnectionFile
	}
	if o.LeanIdle <= 0 {
		o.LeanIdle = 10 * time.Second
	}
	return o
}

var (
	// ErrNoReply: the request's deadline passed without a reply. A kernel
	// drops a badly signed message silently, so a wrong key looks the same
	// as a kernel that does not answer.
	ErrNoReply = errors.New("no reply: signature rejected or kernel unresponsive")
	// ErrNotConnected: the deadline passed while the client was reconnecting.
	ErrNotConnected = errors.New("not connected to the kernel (reconnecting)")
	// ErrConnectionLost: the sockets a request went out on were closed (EOF
	// or missed heartbeat) before its reply came; the request may have run.
	ErrConnectionLost = errors.New("connection to the kernel lost before the reply")
	// ErrHeartbeatMissed: the heartbeat went unanswered for HeartbeatTimeout.
	ErrHeartbeatMissed = errors.New("heartbeat missed")
	// ErrConnectionFileDeleted: the connection file is gone (the kernel was
	// shut down); the client has stopped.
	ErrConnectionFileDeleted = errors.New("connection file deleted: the kernel was shut down")
	// ErrClosed: the client was closed or has stopped.
	ErrClosed = errors.New("client closed")
)

// Client is one attachment to one kernel, beside the user's own frontend.
// Its methods are safe for concurrent use.
//
// It keeps the connection by itself: on EOF from any socket or a missed
// heartbeat it closes every socket and rebuilds them all with backoff,
// re-reading the connection file (Dial only), until it reconnects, the file
// is deleted, or Close is called; Events reports each step.
type Client struct {
	opts   Options
	path   string // connection file; "" for DialInfo (never re-read)
	limits Limits
	guard  *guardConfig
	// iopubGuard is guard with the much smaller iopub limits.
	iopubGuard *guardConfig

	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the supervisor
	stopped chan struct{}  // closed when the supervisor has returned
	events  chan Event
	once    sync.Once

	alive        atomic.Bool
	execState    atomic.Pointer[string]
	decodeErrors atomic.Uint64 // messages dropped: bad signature or malformed
	iopubOther   atomic.Uint64 // iopub messages on other topics, dropped unread

	mu      sync.Mutex
	info    ConnectionInfo
	gen     *generation   // nil while reconnecting
	ready   chan struct{} // closed while gen != nil
	pending map[string]chan *Message
	kernel  KernelInfo // from the latest (re)attach
	stopErr error
}

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

// Dial reads a kernel connection file and attaches to the kernel: it
// connects every socket and waits for a kernel_info reply on control, within
// ctx and Options.ConnectTimeout. ctx bounds only the attach; the client
// lives until Close. On reconnect the file is read again.
func Dial(ctx context.Context, connectionFile string, opts Options) (*Client, error) {
	opts = opts.withDefaults()
	info, err := opts.ReadConnectionFile(connectionFile)
	if err != nil {
		return nil, err
	}
	return dial(ctx, connectionFile, info, opts)
}

// DialInfo is Dial with connection info given directly. It never reads a
// file: reconnects retry the same endpoints and key.
func DialInfo(ctx context.Context, info ConnectionInfo, opts Options) (*Client, error) {
	if err := info.validate(); err != nil {
		return nil, &ConnectionFileError{Path: info.Path, Err: err}
	}
	return dial(ctx, "", info, opts)
}

func (ci ConnectionInfo) validate() error {
	if ci.Transport != "tcp" && ci.Transport != "ipc" {
		return fmt.Errorf("transport %q is not supported: want \"tcp\" or \"ipc\"", ci.Transport)
	}
	if ci.SignatureScheme != "" && ci.SignatureScheme != "hmac-sha256" {
		return fmt.Errorf("signature_scheme %q is not supported: want hmac-sha256", ci.SignatureScheme)
	}
	if ci.Transport == "ipc" && ci.IP == "" {
		return errors.New("ipc transport needs a socket path prefix in IP")
	}
	for _, p := range []int{ci.ShellPort, ci.IOPubPort, ci.ControlPort, ci.HBPort} {
		if p <= 0 || (ci.Transport == "tcp" && p > 65535) {
			return fmt.Errorf("port %d out of range", p)
		}
	}
	return nil
}

func dial(ctx context.Context, path string, info ConnectionInfo, opts Options) (*Client, error) {
	if err := registerTransports(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	limits := Limits{MaxFrameBytes: opts.MaxFrameBytes}.withDefaults()
	cctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		opts:   opts,
		path:   path,
		limits: limits,
		guard:  newGuardConfig(limits, opts.ConnectTimeout, opts.Dial),
		iopubGuard: newGuardConfig(Limits{MaxFrameBytes: opts.MaxIOPubFrameBytes, MaxFrames: limits.MaxFrames},
			opts.ConnectTimeout, opts.Dial),
		ctx:     cctx,
		cancel:  cancel,
		stopped: make(chan struct{}),
		events:  make(chan Event, eventBuffer(opts)),
		info:    info,
		ready:   make(chan struct{}),
		pending: make(map[string]chan *Message),
	}
	actx, acancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer acancel()
	g, ki, err := c.connect(actx, info)
	if err != nil {
		cancel()
		if isRefused(err) {
			return nil, fmt.Errorf("attach to kernel %s: %w: nothing listens on the kernel's ports (is the kernel running?)", describe(path, info), err)
		}
		return nil, fmt.Errorf("attach to kernel %s: %w", describe(path, info), err)
	}
	c.publish(g, ki)
	c.emit(Event{Kind: EventConnected, Session: ki.Session})
	c.wg.Add(1)
	go c.supervise(g)
	return c, nil
}

func describe(path string, info ConnectionInfo) string {
	if path == "" {
		path = info.Path
	}
	if path != "" {
		return "(connection file " + path + ")"
	}
	if info.Transport == "ipc" {
		return "(ipc " + info.IP + ")"
	}
	return fmt.Sprintf("(%s shell port %d)", connectHost(info.IP), info.ShellPort)
}

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

// publish makes g the live generation.
func (c *Client) publish(g *generation, ki KernelInfo) {
	c.mu.Lock()
	c.gen = g
	c.kernel = ki
	close(c.ready)
	c.mu.Unlock()
	c.alive.Store(true)
}

// retire unpublishes g and closes it.
func (c *Client) retire(g *generation) {
	c.alive.Store(false)
	defer c.alive.Store(false) // again: g's heartbeat may have set it meanwhile
	c.mu.Lock()
	if c.gen == g {
		c.gen = nil
		c.ready = make(chan struct{})
	}
	c.mu.Unlock()
	c.execState.Store(nil)
	g.close()
}

// supervise owns the live generation: it reads its iopub until the
// generation fails, then rebuilds the connection, until Close or the
// connection file is deleted.
func (c *Client) supervise(g *generation) {
	defer c.wg.Done()
	defer close(c.stopped)
	for {
		c.readIOPub(g)
		if c.ctx.Err() != nil {
			c.retire(g)
			c.setStopErr(ErrClosed)
			c.emit(Event{Kind: EventClosed})
			return
		}
		c.alive.Store(false)
		c.emit(Event{Kind: EventDisconnected, Err: g.err})
		c.retire(g)
		var err error
		if g, err = c.reconnect(); g == nil {
			c.setStopErr(err)
			ev := Event{Kind: EventClosed}
			if !errors.Is(err, ErrClosed) {
				ev.Err = err
			}
			c.emit(ev)
			return
		}
	}
}

func (c *Client) setStopErr(err error) {
	c.mu.Lock()
	c.stopErr = err
	c.mu.Unlock()
}

const minBackoff = 50 * time.Millisecond

// reconnect retries connect with exponential backoff. It returns nil and
// the reason when the client must stop.
func (c *Client) reconnect() (*generation, error) {
	backoff := minBackoff
	missing := 0
	deadSent := false
	for {
		c.mu.Lock()
		info, prevSession := c.info, c.kernel.Session
		c.mu.Unlock()
		try := true
		if c.path != "" {
			fresh, err := c.opts.ReadConnectionFile(c.path)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// Twice in a row, so that a file being replaced is not
				// taken for a shutdown.
				if missing++; missing >= 2 {
					return nil, fmt.Errorf("%w: %s", ErrConnectionFileDeleted, c.path)
				}
				try = false
			case err != nil:
				// Being rewritten, or damaged: retry with what we had.
			default:
				missing = 0
				info = fresh
			}
		}
		if try {
			ctx, cancel := context.WithTimeout(c.ctx, c.opts.ConnectTimeout)
			g, ki, err := c.connect(ctx, info)
			cancel()
			if err == nil {
				c.mu.Lock()
				c.info = info
				c.mu.Unlock()
				c.publish(g, ki)
				if ki.Session != prevSession {
					c.emit(Event{Kind: EventRestarted, Session: ki.Session})
				} else {
					c.emit(Event{Kind: EventReconnected, Session: ki.Session})
				}
				return g, nil
			}
			if c.ctx.Err() != nil {
				return nil, ErrClosed
			}
			if !deadSent && isRefused(err) {
				deadSent = true
				c.emit(Event{Kind: EventDead, Err: err})
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return nil, ErrClosed
		case <-t.C:
		}
		backoff = min(2*backoff, c.opts.MaxBackoff)
	}
}

// eventBuffer: Events() is never sent on when OnEvent takes the events.
func eventBuffer(opts Options) int {
	if opts.OnEvent != nil {
		return 0
	}
	return 32
}

// emit delivers ev without ever blocking (unless OnEvent does): when the
// buffer is full the oldest event is dropped. Only the supervisor (and
// dial, before it starts) emits, so events are never sent after Close
// closes the channel.
func (c *Client) emit(ev Event) {
	ev.Time = time.Now()
	if c.opts.OnEvent != nil {
		c.opts.OnEvent(ev)
		return
	}
	for {
		select {
		case c.events <- ev:
			return
		default:
		}
		select {
		case <-c.events:
		default:
		}
	}
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

// maxTopicBytes bounds the iopub topics we look at: kernel.<uuid>.status.
const maxTopicBytes = 256

// readIOPub reads the kernel's status messages until the generation
// fails (any of its sockets, or Close), which closes iopub.
func (c *Client) readIOPub(g *generation) {
	narrowed := false
	var work shellWork // this generation's: what the last one saw is gone
	for {
		zm, err := g.iopub.RecvMsg()
		if err != nil {
			g.fail(fmt.Errorf("iopub channel: %w", err))
			return
		}
		if zm.Type == zmq4.CmdMsg {
			continue // a ZMTP command (PING is answered by RecvMsg)
		}
		if len(zm.Frames) == 0 || !isStatusTopic(zm.Frames[0]) {
			// Only possible before the subscription is narrowed.
			c.iopubOther.Add(1)
			continue
		}
		msg, err := Decode(zm.Frames, g.key, c.limits)
		if err == nil && msg.Header.MsgType == "iopub_welcome" {
			// ipykernel >= 7's XPUB greets every new subscription (JEP 65),
			// on the subscribed topic: ours is a status topic.
			c.iopubOther.Add(1)
			continue
		}
		if err != nil || msg.Header.MsgType != "status" {
			c.decodeErrors.Add(1)
			continue
		}
		if state, ok := executionState(msg.Content); ok {
			work.status(msg.Parent, state)
			if now := work.state(); now != "" {
				c.execState.Store(&now)
			}
		}
		if !narrowed {
			narrowed = true
			topic := string(zm.Frames[0])
			if err := subscribe(g.iopub, true, topic); err != nil {
				g.fail(fmt.Errorf("iopub subscribe %s: %w", topic, err))
				return
			}
			if err := subscribe(g.iopub, false, "kernel."); err != nil {
				g.fail(fmt.Errorf("iopub unsubscribe: %w", err))
				return
			}
		}
	}
}

// subscribe sends a SUB socket's (un)subscription, as ZMTP 3.0 has it: a
// message whose first byte is 1 to subscribe and 0 to unsubscribe.
func subscribe(conn *zmq4.Conn, on bool, topic string) error {
	flag := byte(0)
	if on {
		flag = 1
	}
	return conn.SendMsg(zmq4.NewMsg(append([]byte{flag}, topic...)))
}

func isStatusTopic(t []byte) bool {
	const prefix, suffix = "kernel.", ".status"
	return len(t) <= maxTopicBytes && len(t) > len(prefix)+len(suffix) &&
		string(t[:len(prefix)]) == prefix && string(t[len(t)-len(suffix):]) == suffix
}

// heartbeat pings every HeartbeatInterval; an answer later than
// HeartbeatTimeout fails the generation.
func (c *Client) heartbeat(g *generation) {
	defer g.wg.Done()
	for {
		if err := g.hb.Send(zmq4.NewMsgString("ping")); err != nil {
			g.fail(fmt.Errorf("heartbeat: %w", err))
			return
		}
		// zmq4's REQ Recv blocks until an answer or Close, whatever ctx
		// says: the same goroutine waits for the answer, and a timer fails
		// the generation when none comes in time (its sockets are then
		// closed, which ends the Recv). One goroutine per kernel instead of
		// a sender and a receiver: a daemon follows a thousand kernels.
		timeout := time.AfterFunc(c.opts.HeartbeatTimeout, func() {
			g.fail(fmt.Errorf("%w: no answer within %v", ErrHeartbeatMissed, c.opts.HeartbeatTimeout))
		})
		_, err := g.hb.Recv()
		if !timeout.Stop() || g.ctx.Err() != nil {
			return // the generation failed (no answer in time) or is closing
		}
		if err != nil {
			g.fail(fmt.Errorf("heartbeat: %w", err))
			return
		}
		select {
		case <-g.failed:
		default:
			c.alive.Store(true)
		}
		wait := time.NewTimer(c.opts.HeartbeatInterval)
		select {
		case <-wait.C:
		case <-g.ctx.Done():
			wait.Stop()
			return
		}
	}
}

// roundTrip sends a request on the live generation (waiting for one while
// reconnecting) and waits for the reply whose parent is the request.
func (c *Client) roundTrip(ctx context.Context, control bool, msgType string, content any) (*Message, error) {
	for {
		if c.ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", msgType, ErrClosed)
		}
		c.mu.Lock()
		g, ready := c.gen, c.ready
		c.mu.Unlock()
		if g != nil {
			return c.roundTripOn(ctx, g, control, msgType, content)
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: %w (%w)", msgType, ErrNotConnected, ctx.Err())
		case <-c.stopped:
			c.mu.Lock()
			stopErr := c.stopErr
			c.mu.Unlock()
			return nil, fmt.Errorf("%s: %w: %w", msgType, ErrClosed, stopErr)
		case <-c.ctx.Done():
			return nil, fmt.Errorf("%s: %w", msgType, ErrClosed)
		}
	}
}

func (c *Client) roundTripOn(ctx context.Context, g *generation, control bool, msgType string, content any) (*Message, error) {
	var body []byte
	if content != nil {
		var err error
		if body, err = jsonMarshal(content); err != nil {
			return nil, fmt.Errorf("%s: encode content: %w", msgType, err)
		}
	}
	msg := &Message{Header: NewHeader(msgType, c.opts.Session, c.opts.Username), Content: body}
	frames, err := Encode(msg, g.key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", msgType, err)
	}
	reply := make(chan *Message, 1)
	id := msg.Header.MsgID
	c.mu.Lock()
	c.pending[id] = reply
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()
	ch := g.shell
	if control {
		ch = g.control
	}
	s, err := c.acquire(ctx, g, ch)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", msgType, err)
	}
	defer c.release(ch)
	// Send succeeds silently when the peer is gone: the deadline below is
	// what catches that.
	if err := s.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		return nil, fmt.Errorf("%s: send: %w", msgType, err)
	}
	select {
	case m := <-reply:
		return m, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w (%w)", msgType, ErrNoReply, ctx.Err())
	case <-g.failed:
		return nil, fmt.Errorf("%s: %w: %w", msgType, ErrConnectionLost, g.err)
	case <-c.ctx.Done():
		return nil, fmt.Errorf("%s: %w", msgType, ErrClosed)
	}
}

// Alive reports whether the kernel answered recently: true after an attach
// and each answered heartbeat, false from the moment a socket hits EOF or a
// heartbeat is missed until the next successful attach.
func (c *Client) Alive() bool { return c.alive.Load() }

// Session returns the kernel's current session id (header.session of its
// kernel_info reply at the latest attach). It changes when the kernel
// restarts.
func (c *Client) Session() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kernel.Session
}

// LastKernelInfo returns the kernel_info reply of the latest attach, with
// no round trip (on jupyter_server even kernel_info counts as activity).
func (c *Client) LastKernelInfo() KernelInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kernel
}

// Info returns the connection info in use (as re-read at the latest attach).
func (c *Client) Info() ConnectionInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.info
}

// ExecutionState says whether the kernel's main shell runs code: "busy"
// from an execute_request's busy status until the idle status of that same
// request, "idle" once such a request was seen and none runs, "" when none
// was seen since the latest attach (a status published before our
// subscription took effect is lost: a cell already running when the client
// attached is not seen). Statuses of other requests (control requests,
// kernel_info, a subshell's requests, comms), whoever sent them, never
// change it (see shellWork).
func (c *Client) ExecutionState() string {
	if s := c.execState.Load(); s != nil {
		return *s
	}
	return ""
}

// Events returns the client's events. The channel is buffered and never
// blocks the client (when full, the oldest event is dropped); Close closes
// it after the final EventClosed. With Options.OnEvent it carries nothing.
func (c *Client) Events() <-chan Event { return c.events }

// Close stops the client: it closes every socket and waits for all of the
// client's goroutines to return. It is safe to call more than once.
func (c *Client) Close() error {
	c.once.Do(func() {
		c.cancel()
		c.wg.Wait()
		close(c.events)
	})
	return nil
}

func executionState(content json.RawMessage) (string, bool) {
	var st struct {
		ExecutionState string `json:"execution_state"`
	}
	if err := json.Unmarshal(content, &st); err != nil || st.ExecutionState == "" {
		return "", false
	}
	return st.ExecutionState, true
}
