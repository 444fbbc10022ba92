package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStatusErrorSaysNoHTTPStatus: what a user reads of a refused call
// is the daemon's reason and the next step, never the transport's code.
func TestStatusErrorSaysNoHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		code      int
		msg, want string
	}{
		{http.StatusBadRequest, "body: unknown field", "refused the request: body: unknown field (this gpumem and the daemon may be different versions"},
		{http.StatusForbidden, "kernel k is not user bob's", "the gpumem daemon refused: kernel k is not user bob's"},
		{http.StatusNotFound, "kernel k is not known to the daemon", "does not know it: kernel k is not known"},
		{http.StatusRequestEntityTooLarge, "body is over 1 bytes", "refused the request: body is over 1 bytes"},
		{http.StatusUnprocessableEntity, "no variable x", "refused the request: no variable x (nothing was changed)"},
		{http.StatusTooManyRequests, "uid 1 already has 8 requests", "the gpumem daemon is busy: uid 1 already has 8 requests"},
		{http.StatusTooManyRequests, "x", "(try again in a moment)"},
		{http.StatusInternalServerError, "boom", "failed: boom (gpumem serve's log says more"},
		{http.StatusBadGateway, "kernel k: closed", "the kernel did not answer the gpumem daemon: kernel k: closed"},
		{http.StatusServiceUnavailable, "history: off", "failed: history: off"},
		{http.StatusGatewayTimeout, "kernel k did not run the free", "timed out: kernel k did not run the free"},
		{http.StatusUnprocessableEntity, "", "refused the request: it gave no reason"},
	} {
		got := (&StatusError{StatusCode: tc.code, Message: tc.msg}).Error()
		if !strings.Contains(got, tc.want) {
			t.Errorf("%d %q: got %q, want it to contain %q", tc.code, tc.msg, got, tc.want)
		}
		if strings.Contains(got, strconv.Itoa(tc.code)) || strings.Contains(got, http.StatusText(tc.code)) {
			t.Errorf("%d %q: %q names the HTTP status", tc.code, tc.msg, got)
		}
	}
}

// TestClientErrorsSayNoTransport: each way a call can fail reaches the
// user as the socket, what happened and what to do: never the request's
// URL or method, nor an HTTP status.
func TestClientErrorsSayNoTransport(t *testing.T) {
	for _, tc := range []struct {
		name  string
		serve func(net.Conn) // nil: no daemon at all
		want  string
	}{
		{"no daemon", nil, "start gpumem serve, or set GPUMEM_SOCKET"},
		{"hung", func(c net.Conn) { _, _ = io.Copy(io.Discard, c) }, "did not answer in time"},
		{"hangs up", func(c net.Conn) { _ = c.Close() }, "did not answer ("},
		{"refuses", reply("422 Unprocessable Entity", `{"error":"no variable x in the kernel"}`),
			"the gpumem daemon refused the request: no variable x in the kernel (nothing was changed)"},
		{"garbles", reply("200 OK", `{"gpus":`), "sent a reply this gpumem cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "s.sock")
			if tc.serve != nil {
				ln, err := net.Listen("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						tc.serve(c)
						_ = c.Close()
					}
				}()
				defer func() { _ = ln.Close(); <-done }()
			}
			c := NewClient(path)
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			_, err := c.GPUs(ctx)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.Contains(msg, path) && tc.name != "refuses" {
				t.Errorf("got %q, want it to name %s and say %q", msg, path, tc.want)
			}
			for _, leak := range []string{"http://", "GET", "Get ", "/api/v1", "422", "Unprocessable"} {
				if strings.Contains(strings.ReplaceAll(msg, path, "PATH"), leak) {
					t.Errorf("%q shows the transport's %q", msg, leak)
				}
			}
		})
	}
}

// reply answers one request with status and body, as a daemon would.
func reply(status, body string) func(net.Conn) {
	return func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, len(body), body)
	}
}
