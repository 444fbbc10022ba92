package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// ErrNoDaemon is matched (errors.Is) by a Client's error when no daemon
// serves the socket: the file does not exist, or nobody listens on it. The
// CLI then works standalone.
var ErrNoDaemon = errors.New("no gpumem daemon")

type noDaemonError struct {
	path string
	err  error
}

func (e *noDaemonError) Error() string {
	return fmt.Sprintf("no gpumem daemon serves %s (%v): start gpumem serve, or set GPUMEM_SOCKET to the socket of one that runs",
		e.path, unwrapURL(e.err))
}
func (e *noDaemonError) Unwrap() error        { return e.err }
func (e *noDaemonError) Is(target error) bool { return target == ErrNoDaemon }

// StatusError is a reply of the daemon other than 200: Message is its
// {"error": ...}. Its Error is a sentence for the user of the CLI: what
// the daemon said and what to do, never the HTTP status, which is the
// API's detail (StatusCode keeps it for callers that branch on it).
type StatusError struct {
	StatusCode int
	Message    string
}

func (e *StatusError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = "it gave no reason"
	}
	return statusLead(e.StatusCode) + msg + statusAdvice(e.StatusCode)
}

// statusLead says what the daemon did, by the kind of its answer.
func statusLead(code int) string {
	switch {
	case code == http.StatusForbidden:
		return "the gpumem daemon refused: "
	case code == http.StatusNotFound:
		return "the gpumem daemon does not know it: "
	case code == http.StatusTooManyRequests:
		return "the gpumem daemon is busy: "
	case code == http.StatusGatewayTimeout:
		return "timed out: "
	case code == http.StatusBadGateway:
		return "the kernel did not answer the gpumem daemon: "
	case code >= 500:
		return "the gpumem daemon failed: "
	default:
		return "the gpumem daemon refused the request: "
	}
}

// statusAdvice is the next step, where the daemon's message has none of
// its own to give.
func statusAdvice(code int) string {
	switch {
	case code == http.StatusTooManyRequests:
		return " (try again in a moment)"
	case code == http.StatusUnprocessableEntity:
		return " (nothing was changed)"
	case code >= 500:
		return " (gpumem serve's log says more; try again, or restart gpumem serve if it keeps failing)"
	case code == http.StatusBadRequest || code == http.StatusRequestEntityTooLarge || code == http.StatusUnsupportedMediaType:
		return " (this gpumem and the daemon may be different versions: gpumem version, and the daemon's, tell)"
	default:
		return ""
	}
}

// DefaultTimeout bounds a Client call whose ctx has no deadline.
const DefaultTimeout = 30 * time.Second

const maxReplyBytes = 64 << 20

// Client talks to the daemon over its unix socket. It is safe for
// concurrent use; Close releases its idle connections.
type Client struct {
	path string
	hc   *http.Client
}

// NewClient returns a client of the daemon serving socketPath. It connects
// on each call's demand; nothing happens here. Each new connection is
// vouched for (vouch.go): a socket that root or this process's user does
// not serve gives an *UntrustedError, and nothing is sent to it.
func NewClient(socketPath string) *Client {
	return newClient(socketPath, systemVoucher())
}

func newClient(socketPath string, v voucher) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return v.dial(ctx, socketPath)
		},
		Proxy:                  nil, // never a proxy, whatever the environment says
		MaxIdleConns:           2,
		IdleConnTimeout:        30 * time.Second,
		DisableCompression:     true,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &Client{
		path: socketPath,
		hc: &http.Client{
			Transport: tr,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
	}
}

// Close closes idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Healthz checks that the daemon answers.
func (c *Client) Healthz(ctx context.Context) error {
	var v struct {
		Status string `json:"status"`
	}
	if err := c.do(ctx, http.MethodGet, "/healthz", nil, &v); err != nil {
		return err
	}
	if v.Status != "ok" {
		return fmt.Errorf("gpumem daemon at %s: health status %q", c.path, v.Status)
	}
	return nil
}

// Notebooks is the daemon's whole report: what `gpumem ls --json` prints.
func (c *Client) Notebooks(ctx context.Context) (attribution.Report, error) {
	var rep attribution.Report
	err := c.do(ctx, http.MethodGet, "/api/v1/notebooks", nil, &rep)
	return rep, err
}

// Kernels lists the kernels the daemon follows (admin callers only).
func (c *Client) Kernels(ctx context.Context) ([]KernelStatus, error) {
	var v KernelsResponse
	err := c.do(ctx, http.MethodGet, "/api/v1/kernels", nil, &v)
	return v.Kernels, err
}

// GPUs lists the GPUs with their memory totals.
func (c *Client) GPUs(ctx context.Context) ([]attribution.GPU, error) {
	var v GPUsResponse
	err := c.do(ctx, http.MethodGet, "/api/v1/gpus", nil, &v)
	return v.GPUs, err
}

// Users is GPU memory per user.
func (c *Client) Users(ctx context.Context) ([]UserUsage, error) {
	var v UsersResponse
	err := c.do(ctx, http.MethodGet, "/api/v1/users", nil, &v)
	return v.Users, err
}

// Kernel is one kernel's entry.
func (c *Client) Kernel(ctx context.Context, kernelID string) (attribution.Notebook, error) {
	var nb attribution.Notebook
	err := c.do(ctx, http.MethodGet, "/api/v1/kernels/"+url.PathEscape(kernelID), nil, &nb)
	return nb, err
}

// Free frees GPU memory in a kernel; the zero FreeRequest frees caches only.
// It returns the daemon's JSON reply as is.
func (c *Client) Free(ctx context.Context, kernelID string, req FreeRequest) (json.RawMessage, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode free request: %w", err)
	}
	var reply json.RawMessage
	err = c.do(ctx, http.MethodPost, "/api/v1/kernels/"+url.PathEscape(kernelID)+"/free", body, &reply)
	return reply, err
}

// FreeChildren ends the GPU-holding worker processes of a kernel (never the
// kernel): the idle ones, or only those req.PIDs confirms. It returns the
// daemon's report as is.
func (c *Client) FreeChildren(ctx context.Context, kernelID string, req FreeChildrenRequest) (json.RawMessage, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	body := []byte{}
	if len(req.PIDs) > 0 {
		var err error
		if body, err = json.Marshal(req); err != nil {
			return nil, fmt.Errorf("encode free --children request: %w", err)
		}
	}
	var reply json.RawMessage
	err := c.do(ctx, http.MethodPost, "/api/v1/kernels/"+url.PathEscape(kernelID)+"/children/free", body, &reply)
	return reply, err
}

// Why is a kernel's %gpumem why, joined with the driver's figures and
// rendered by the kernel.
func (c *Client) Why(ctx context.Context, kernelID string, q WhyQuery) (json.RawMessage, error) {
	v := url.Values{}
	if q.AllDevices {
		v.Set("all_devices", "1")
	}
	if q.Device != nil {
		v.Set("device", strconv.Itoa(*q.Device))
	}
	if q.Budget > 0 {
		v.Set("budget", strconv.FormatFloat(q.Budget, 'f', -1, 64))
	}
	path := "/api/v1/kernels/" + url.PathEscape(kernelID) + "/why"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var reply json.RawMessage
	err := c.do(ctx, http.MethodGet, path, nil, &reply)
	return reply, err
}

// EndOrphans ends processes reclaim left running for a kernel (req.PIDs,
// or all of them).
func (c *Client) EndOrphans(ctx context.Context, kernelID string, req EndOrphansRequest) (EndOrphansReply, error) {
	var reply EndOrphansReply
	if err := req.Validate(); err != nil {
		return reply, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return reply, fmt.Errorf("encode end request: %w", err)
	}
	err = c.do(ctx, http.MethodPost, "/api/v1/kernels/"+url.PathEscape(kernelID)+"/orphans/end", body, &reply)
	return reply, err
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+SocketHost+path, rd)
	if err != nil {
		return fmt.Errorf("gpumem daemon request %s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *UntrustedError
		if errors.As(err, &ue) {
			return ue // its own line: the path, who serves it, what to do
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return &noDaemonError{path: c.path, err: err}
		}
		return transportError(ctx, c.path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return fmt.Errorf("the gpumem daemon at %s broke off its reply (%w): try again; if it keeps failing, "+
			"gpumem serve's log says why", c.path, unwrapURL(err))
	}
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb.Error = string(bytes.TrimSpace(data))
		}
		return &StatusError{StatusCode: resp.StatusCode, Message: eb.Error}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("the gpumem daemon at %s sent a reply this gpumem cannot read (%w): "+
			"it may be another version (compare gpumem version with the daemon's) or restart gpumem serve", c.path, err)
	}
	return nil
}

// transportError says why a call got no reply, without the request's
// URL or method (http.Client's wording): the socket, and what to do.
func transportError(ctx context.Context, path string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
		return fmt.Errorf("the gpumem daemon at %s did not answer in time (%w): it may be busy or hung; "+
			"try again, or restart gpumem serve if it keeps not answering", path, context.DeadlineExceeded)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("call to the gpumem daemon at %s: %w", path, context.Canceled)
	}
	return fmt.Errorf("the gpumem daemon at %s did not answer (%w): try again; if it keeps failing, "+
		"restart gpumem serve (its log says why)", path, unwrapURL(err))
}

// unwrapURL is the cause inside http.Client's *url.Error, whose text
// names the request ("Get \"http://...\": ...").
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
