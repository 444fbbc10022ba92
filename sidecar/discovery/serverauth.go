package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// ErrNoToken marks a server that gpumem may not ask for its sessions: its
// info file holds no token (it asks for a password, or trusts an external
// login such as JupyterHub's) and none was given.
var ErrNoToken = errors.New("no usable token")

// noTokenError is the one line said about such a server. gpumem then does
// not guess: a kernel of that server is named only by its own environment
// (JPY_SESSION_NAME, which jupyter_server 2 sets), else left unnamed.
func (s Server) noTokenError() error {
	return fmt.Errorf("server %s (%s): %w in its file (password or external login): its kernels' notebooks come from their JPY_SESSION_NAME only; set GPUMEM_SERVER_TOKEN to a token it accepts to ask it",
		s.URL, s.File, ErrNoToken)
}

// requestTarget is the base URL to send requests to and the client to send
// them with: s.URL and hc over TCP; for a server on a unix socket
// (ServerApp.sock: its URL is http+unix://<percent-encoded socket path>/base/),
// http://localhost/base/ and a client dialing that socket.
func (s Server) requestTarget(hc *http.Client) (string, *http.Client, error) {
	const scheme = "http+unix://"
	if !strings.HasPrefix(s.URL, scheme) {
		return s.URL, hc, nil
	}
	rest := s.URL[len(scheme):]
	host, path, _ := strings.Cut(rest, "/")
	sock, err := url.PathUnescape(host)
	if err != nil || sock == "" {
		return "", nil, fmt.Errorf("unix socket URL %q: bad socket path", s.URL)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	return "http://localhost/" + path, &http.Client{Timeout: hc.Timeout, Transport: tr}, nil
}
