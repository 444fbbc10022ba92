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
	shellWorkAt  atomic.Int64  // unix ns of the main shell's last busy or idle status
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
		select {
		case <-g.failed:
			// The generation failed (a channel read an oversized frame, say)
			// and its end cancelled this socket: that failure is the cause,
			// not the "context canceled" the send saw. fail closes failed
			// before it cancels, so this is seen whenever it is so.
			return nil, fmt.Errorf("%s: %w: %w", msgType, ErrConnectionLost, g.err)
		default:
		}
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

// LastShellWork is when a status of the main shell's work (an execute's
// busy or idle, as ExecutionState follows) last arrived; zero before one.
// A cell that just ended was in use until then, whatever its server's
// last_activity, read now and then, says.
func (c *Client) LastShellWork() time.Time {
	if ns := c.shellWorkAt.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
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
