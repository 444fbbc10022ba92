package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// KernelInfo is the useful part of a kernel_info_reply.
type KernelInfo struct {
	ProtocolVersion       string
	Implementation        string // "ipython" for ipykernel
	ImplementationVersion string
	Language              string // language_info.name, e.g. "python"
	LanguageVersion       string
	Banner                string
	Session               string // header.session of the reply: changes on restart
}

// ExecuteOptions controls an execute_request. The zero value is silent,
// store_history=false, allow_stdin=false, stop_on_error=false. The code is
// sent as given: keeping a silent request from touching the user's
// sys.last_* and friends is the caller's business (package magics wraps
// its own code), since that is Python, not protocol.
type ExecuteOptions struct {
	// NotSilent sends silent=false (the default request is silent).
	NotSilent bool
	// StoreHistory sends store_history=true (default false).
	StoreHistory bool
	// UserExpressions are evaluated after the code; see ExecuteReply.
	UserExpressions map[string]string
}

// ExecuteReply is the content of an execute_reply plus decoded
// user_expressions.
type ExecuteReply struct {
	Status         string // "ok", "error", "aborted"
	ExecutionCount int
	EName, EValue  string
	Traceback      []string
	// UserExpressions maps each requested name to its evaluated result.
	UserExpressions map[string]ExpressionResult
	// KernelTime is the kernel's own time for the request: the reply's
	// header.date minus metadata.started (0 when either is missing).
	KernelTime time.Duration
}

// Err returns nil when Status is "ok", else an error naming the exception.
func (r ExecuteReply) Err() error {
	switch r.Status {
	case "ok":
		return nil
	case "error":
		return fmt.Errorf("execute: %s: %s", r.EName, r.EValue)
	}
	return fmt.Errorf("execute: status %q", r.Status)
}

// ExpressionResult is one evaluated user expression.
type ExpressionResult struct {
	Status        string                     // "ok" or "error"
	Data          map[string]json.RawMessage // mime bundle: "text/plain", "application/json", ...
	EName, EValue string
	Traceback     []string
}

// ErrNoJSON is returned by ExpressionResult.JSON when the value has no
// application/json representation.
var ErrNoJSON = errors.New("expression has no application/json value (its object needs a _repr_json_ method)")

// JSON returns the expression's application/json value (what an object's
// _repr_json_ produced), or an error naming the expression's failure.
func (r ExpressionResult) JSON() (json.RawMessage, error) {
	if r.Status != "ok" {
		return nil, fmt.Errorf("expression failed: %s: %s", r.EName, r.EValue)
	}
	v, ok := r.Data["application/json"]
	if !ok {
		if text, ok := r.Data["text/plain"]; ok {
			return nil, fmt.Errorf("%w; its text/plain is %s", ErrNoJSON, clip(text, 80))
		}
		return nil, ErrNoJSON
	}
	return v, nil
}

// jsonMarshal is json.Marshal without HTML escaping.
func jsonMarshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func expectReply(msg *Message, want string) error {
	if msg.Header.MsgType != want {
		return fmt.Errorf("got %s, want %s", msg.Header.MsgType, want)
	}
	return nil
}

// KernelInfo sends kernel_info_request on the control channel, which a
// kernel busy running a cell still answers.
func (c *Client) KernelInfo(ctx context.Context) (KernelInfo, error) {
	msg, err := c.roundTrip(ctx, true, "kernel_info_request", nil)
	if err != nil {
		return KernelInfo{}, err
	}
	return parseKernelInfo(msg)
}

func parseKernelInfo(msg *Message) (KernelInfo, error) {
	if err := expectReply(msg, "kernel_info_reply"); err != nil {
		return KernelInfo{}, fmt.Errorf("kernel_info_request: %w", err)
	}
	var content struct {
		ProtocolVersion       string `json:"protocol_version"`
		Implementation        string `json:"implementation"`
		ImplementationVersion string `json:"implementation_version"`
		Banner                string `json:"banner"`
		LanguageInfo          struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"language_info"`
	}
	if err := json.Unmarshal(msg.Content, &content); err != nil {
		return KernelInfo{}, fmt.Errorf("kernel_info_reply: %w", err)
	}
	return KernelInfo{
		ProtocolVersion:       content.ProtocolVersion,
		Implementation:        content.Implementation,
		ImplementationVersion: content.ImplementationVersion,
		Language:              content.LanguageInfo.Name,
		LanguageVersion:       content.LanguageInfo.Version,
		Banner:                content.Banner,
		Session:               msg.Header.Session,
	}, nil
}

// Interrupt sends interrupt_request on the control channel and waits for
// the reply. (ipykernel then sends SIGINT to its process group.)
func (c *Client) Interrupt(ctx context.Context) error {
	msg, err := c.roundTrip(ctx, true, "interrupt_request", nil)
	if err != nil {
		return err
	}
	return expectReply(msg, "interrupt_reply")
}

// Usage sends usage_request on the control channel (ipykernel >= 6.9; older
// kernels do not answer: ErrNoReply at the deadline) and returns the kernel
// process's pid.
func (c *Client) Usage(ctx context.Context) (pid int, err error) {
	msg, err := c.roundTrip(ctx, true, "usage_request", nil)
	if err != nil {
		return 0, err
	}
	if err := expectReply(msg, "usage_reply"); err != nil {
		return 0, fmt.Errorf("usage_request: %w", err)
	}
	var content struct {
		PID *int `json:"pid"`
	}
	if err := json.Unmarshal(msg.Content, &content); err != nil {
		return 0, fmt.Errorf("usage_reply: %w", err)
	}
	if content.PID == nil || *content.PID <= 0 {
		return 0, errors.New("usage_reply has no pid")
	}
	return *content.PID, nil
}

type executeRequest struct {
	Code            string            `json:"code"`
	Silent          bool              `json:"silent"`
	StoreHistory    bool              `json:"store_history"`
	UserExpressions map[string]string `json:"user_expressions"`
	AllowStdin      bool              `json:"allow_stdin"`
	StopOnError     bool              `json:"stop_on_error"`
}

type expressionContent struct {
	Status    string                     `json:"status"`
	Data      map[string]json.RawMessage `json:"data"`
	EName     string                     `json:"ename"`
	EValue    string                     `json:"evalue"`
	Traceback []string                   `json:"traceback"`
}

func (e expressionContent) result() ExpressionResult {
	return ExpressionResult(e)
}

// Execute sends execute_request on the shell channel and waits, within ctx,
// for its reply: a kernel busy with a cell answers when the cell is done.
// By default the request is silent (no execution_count, no history, no
// outputs in the frontend); the code is sent as given.
func (c *Client) Execute(ctx context.Context, code string, opts ExecuteOptions) (ExecuteReply, error) {
	req := executeRequest{
		Code:            code,
		Silent:          !opts.NotSilent,
		StoreHistory:    opts.StoreHistory,
		UserExpressions: opts.UserExpressions,
	}
	if req.UserExpressions == nil {
		req.UserExpressions = map[string]string{}
	}
	msg, err := c.roundTrip(ctx, false, "execute_request", req)
	if err != nil {
		return ExecuteReply{}, err
	}
	return parseExecuteReply(msg)
}

func parseExecuteReply(msg *Message) (ExecuteReply, error) {
	if err := expectReply(msg, "execute_reply"); err != nil {
		return ExecuteReply{}, fmt.Errorf("execute_request: %w", err)
	}
	var content struct {
		Status          string                       `json:"status"`
		ExecutionCount  int                          `json:"execution_count"`
		EName           string                       `json:"ename"`
		EValue          string                       `json:"evalue"`
		Traceback       []string                     `json:"traceback"`
		UserExpressions map[string]expressionContent `json:"user_expressions"`
	}
	if err := json.Unmarshal(msg.Content, &content); err != nil {
		return ExecuteReply{}, fmt.Errorf("execute_reply: %w", err)
	}
	reply := ExecuteReply{
		Status:         content.Status,
		ExecutionCount: content.ExecutionCount,
		EName:          content.EName,
		EValue:         content.EValue,
		Traceback:      content.Traceback,
	}
	var meta struct {
		Started string `json:"started"`
	}
	if json.Unmarshal(msg.Metadata, &meta) == nil {
		started, err := time.Parse(time.RFC3339Nano, meta.Started)
		if done := msg.Header.Time(); err == nil && !done.IsZero() && done.After(started) {
			reply.KernelTime = done.Sub(started)
		}
	}
	reply.UserExpressions = make(map[string]ExpressionResult, len(content.UserExpressions))
	for name, e := range content.UserExpressions {
		reply.UserExpressions[name] = e.result()
	}
	return reply, nil
}
