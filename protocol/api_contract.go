package protocol

// This file fixes the exported API that the rest of gpumem builds against.
// Implementations live in the other files of this package.

import (
	"context"
	"encoding/json"
	"time"
)

// ConnectionInfo is a parsed, validated kernel connection file.
type ConnectionInfo struct {
	Path            string // file it was read from ("" when parsed from bytes)
	Transport       string // "tcp" or "ipc"
	IP              string
	ShellPort       int
	IOPubPort       int
	StdinPort       int
	ControlPort     int
	HBPort          int
	Key             string // HMAC key as UTF-8 bytes; "" = unsigned
	SignatureScheme string // "hmac-sha256"
	KernelName      string // optional
}

// ExecuteOptions controls an execute_request. The zero value is silent,
// store_history=false, allow_stdin=false, stop_on_error=false.
type ExecuteOptions struct {
	// NotSilent sends silent=false (the default request is silent).
	NotSilent bool
	// StoreHistory sends store_history=true (default false).
	StoreHistory bool
	// UserExpressions are evaluated after the code; see ExecuteReply.
	UserExpressions map[string]string
}

// ExecuteReply is the content of an execute_reply plus decoded user_expressions.
type ExecuteReply struct {
	Status         string // "ok", "error", "aborted"
	ExecutionCount int
	EName, EValue  string
	Traceback      []string
	// UserExpressions maps each requested name to its evaluated result.
	UserExpressions map[string]ExpressionResult
}

// ExpressionResult is one evaluated user expression.
type ExpressionResult struct {
	Status string                     // "ok" or "error"
	Data   map[string]json.RawMessage // mime bundle: "text/plain", "application/json", ...
	EName, EValue string
}

// JSON returns the expression's application/json value (what an object's
// _repr_json_ produced), or an error naming the expression's failure.
// func (r ExpressionResult) JSON() (json.RawMessage, error)

// KernelInfo is the useful part of a kernel_info_reply.
type KernelInfo struct {
	ProtocolVersion string
	Implementation  string
	Language        string // language_info.name, e.g. "python"
	LanguageVersion string
	Banner          string
	Session         string // header.session of the reply: changes on restart
}

// Event reports a change in the kernel's life, delivered on Client.Events().
type Event struct {
	Kind    EventKind
	Session string    // new kernel session id (EventRestarted / EventConnected)
	Err     error     // EventDisconnected / EventClosed cause
	Time    time.Time
}

// EventKind enumerates Client events.
type EventKind int

const (
	EventConnected    EventKind = iota // first attach succeeded
	EventDisconnected                  // sockets hit EOF or heartbeat missed; reconnecting
	EventRestarted                     // reconnected and the kernel's session id changed
	EventReconnected                   // reconnected, same session (transient outage)
	EventDead                          // heartbeat missed and process presumed dead
	EventClosed                        // connection file deleted or Close called: client stopped
)

// Options configures Dial. Zero values get sensible defaults.
type Options struct {
	HeartbeatInterval time.Duration // default 1s
	HeartbeatTimeout  time.Duration // per beat; default 1s. Missed beats → reconnect attempt
	MaxFrameBytes     int64         // default 64 MiB
	// The client's own session id; default a fresh uuid.
	Session  string
	Username string // default "gpumem"
}

// Compile-time reminder of the Client's method set (implemented in client.go):
//
//	func Dial(ctx context.Context, connectionFile string, opts Options) (*Client, error)
//	func DialInfo(ctx context.Context, info ConnectionInfo, opts Options) (*Client, error)
//	func (c *Client) KernelInfo(ctx context.Context) (KernelInfo, error)   // on control
//	func (c *Client) Execute(ctx context.Context, code string, opts ExecuteOptions) (ExecuteReply, error) // on shell
//	func (c *Client) Interrupt(ctx context.Context) error                  // interrupt_request on control
//	func (c *Client) Usage(ctx context.Context) (pid int, err error)       // usage_request on control (ipykernel >= 6.9)
//	func (c *Client) Alive() bool                                           // heartbeat answered recently
//	func (c *Client) Session() string                                       // kernel's current session id
//	func (c *Client) Events() <-chan Event                                  // buffered; never blocks the client
//	func (c *Client) Close() error                                          // stops all goroutines, waits for them
var _ = context.Background
