package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// ErrNoToken marks a server that gpumem may not ask for its sessions: its
// info file holds no token (it asks for a password, or trusts an external
// login such as JupyterHub's) and none was given.
var ErrNoToken = errors.New("no usable token")

// noTokenError is the one line said about such a server. gpumem then does
// not guess: a kernel of that server is named only by its own environment
// (JPY_SESSION_NAME, which jupyter_server 2 sets), else left unnamed.
func (s Server) noTokenError() error {
	return fmt.Errorf("server %s (%s): %w in its file (password or external login): its kernels' notebooks come from their JPY_SESSION_NAME only; set GPUMEM_SERVER_TOKEN to a token it accepts, and GPUMEM_SERVER_TOKEN_URLS to its URL, to ask it",
		s.URL, s.File, ErrNoToken)
}

// A server file is written by its user, who chooses its url: it could name
// any listener on this host (another user's server, a database, the
// daemon's own socket) or a host elsewhere. So no request goes where a
// server file points unless the listener there belongs to the file's owner,
// checked when the connection is made: for TCP, the owner of the listening
// socket (the kernel's record in /proc/net/tcp{,6}) on an address of this
// host, and the connection goes to exactly that address; for a unix socket,
// the peer's credentials (SO_PEERCRED) once connected, before a byte is
// sent. A token (the file's own or GPUMEM_SERVER_TOKEN) is thus only ever
// sent to a process of the file's owner.

// errForeignListener marks a server whose url leads to a listener that is
// not its file owner's, or not on this host: it is not asked.
var errForeignListener = errors.New("not the server file's owner's")

// errNoListener marks a server whose address nothing listens on.
var errNoListener = errors.New("nothing listens there")

// ListenerFinder says who listens on a TCP address of this host. ProcFinder
// is one, from /proc/net/tcp{,6}.
type ListenerFinder interface {
	// TCPListener is the listening socket that serves connections to
	// ip:port (bound to ip, or to the wildcard address).
	TCPListener(ip net.IP, port int) (procs.Listener, bool, error)
}

// TCPListener implements ListenerFinder.
func (f *ProcFinder) TCPListener(ip net.IP, port int) (procs.Listener, bool, error) {
	listening, err := f.fs.ListeningTCPPorts()
	if err != nil && len(listening) == 0 {
		return procs.Listener{}, false, err
	}
	l, ok := listenerAt(listening[port], ip)
	return l, ok, nil
}

// requestTarget is the base URL to send requests to and the client to send
// them with, whose connections go only to a listener of the file's owner
// (see above): s.URL over TCP; for a server on a unix socket
// (ServerApp.sock: its URL is http+unix://<percent-encoded socket path>/base/),
// http://localhost/base/ through that socket.
func (s Server) requestTarget(hc *http.Client) (string, *http.Client, error) {
	const scheme = "http+unix://"
	client := func(dial func(ctx context.Context) (net.Conn, error)) *http.Client {
		return &http.Client{Timeout: hc.Timeout, Transport: &http.Transport{
			DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
			DisableKeepAlives:   true,
			TLSHandshakeTimeout: 10 * time.Second,
			Proxy:               nil, // a server of this host is asked directly
		}}
	}
	if strings.HasPrefix(s.URL, scheme) {
		if s.netns != nil {
			return "", nil, errors.New("a server on a unix socket is not asked in pods: its path is in the pod's mount namespace")
		}
		rest := s.URL[len(scheme):]
		host, path, _ := strings.Cut(rest, "/")
		sock, err := url.PathUnescape(host)
		if err != nil || sock == "" {
			return "", nil, fmt.Errorf("unix socket URL %q: bad socket path", s.URL)
		}
		return "http://localhost/" + path, client(func(ctx context.Context) (net.Conn, error) { return s.dialUnix(ctx, sock) }), nil
	}
	u, err := url.Parse(s.URL)
	if err != nil || u.Hostname() == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", nil, fmt.Errorf("url %q: want http://HOST:PORT/… or http+unix://…", s.URL)
	}
	port, err := urlPort(u.Scheme, u.Port())
	if err != nil {
		return "", nil, fmt.Errorf("url %q: %w", s.URL, err)
	}
	return s.URL, client(func(ctx context.Context) (net.Conn, error) { return s.dialTCP(ctx, u.Hostname(), port) }), nil
}

// dialUnix connects to the server's socket and keeps the connection only
// when the process listening there runs as the file's owner.
func (s Server) dialUnix(ctx context.Context, sock string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	uid, err := peerUID(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if uid != s.FileUID {
		c.Close()
		return nil, fmt.Errorf("socket %s is served by uid %d, but the file belongs to uid %d: %w", sock, uid, s.FileUID, errForeignListener)
	}
	return c, nil
}

// peerUID is the uid of the process at the other end of a unix socket.
func peerUID(c net.Conn) (uint32, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("connection is %T, not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred.Uid, nil
}

// dialTCP resolves host, keeps the addresses of this host whose listener on
// port belongs to the file's owner, and connects to the first. Inside a
// pod, "this host" is the pod's network namespace: a listener found in its
// table is the pod's, and a host name is its loopback (as PodFinder.Dial).
func (s Server) dialTCP(ctx context.Context, host string, port int) (net.Conn, error) {
	var ips []net.IP
	var err error
	if s.netns != nil {
		ips = []net.IP{net.ParseIP(host)}
		if ips[0] == nil {
			ips[0] = net.IPv4(127, 0, 0, 1)
		}
	} else if ips, err = resolveHost(ctx, host); err != nil {
		return nil, err
	}
	lf := s.listeners
	if s.netns != nil {
		lf = s.netns
	} else if lf == nil {
		lf = NewProcFinder(&procs.FS{})
	}
	local := map[string]bool{}
	if s.netns == nil {
		if local, err = localAddresses(); err != nil {
			return nil, err
		}
	}
	var refused error
	for _, ip := range ips {
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
		if s.netns == nil && !ip.IsLoopback() && !local[ip.String()] {
			refused = fmt.Errorf("%s is not an address of this host: %w", addr, errForeignListener)
			continue
		}
		l, ok, err := lf.TCPListener(ip, port)
		if err != nil {
			return nil, fmt.Errorf("who listens on %s: %w", addr, err)
		}
		if !ok {
			continue
		}
		if l.UID != s.FileUID {
			refused = fmt.Errorf("%s is served by uid %d, but the file belongs to uid %d: %w", addr, l.UID, s.FileUID, errForeignListener)
			continue
		}
		if s.netns != nil {
			return s.netns.dial(ctx, "tcp", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	if refused != nil {
		return nil, refused
	}
	return nil, fmt.Errorf("%s port %d: %w", host, port, errNoListener)
}

// resolveHost is the addresses a server URL's host names: an IP literal
// itself, localhost's loopback addresses, else what the resolver says
// (within 5 s).
func resolveHost(ctx context.Context, host string) ([]net.IP, error) {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}, nil
	}
	if strings.EqualFold(host, "localhost") {
		return []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	ips := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		ips = append(ips, a.IP)
	}
	return ips, nil
}

// localAddresses is the set of this host's interface addresses.
func localAddresses() (map[string]bool, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("this host's addresses: %w", err)
	}
	out := map[string]bool{}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out[n.IP.String()] = true
		}
	}
	return out, nil
}

// urlPort is a URL's port, or its scheme's default.
func urlPort(scheme, port string) (int, error) {
	if port == "" {
		if scheme == "https" {
			return 443, nil
		}
		return 80, nil
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p > 65535 {
		return 0, fmt.Errorf("port %q", port)
	}
	return p, nil
}

// requestError words a failed request to s: a listener of another user (or
// of no host of ours) means the server was not asked at all.
func (s Server) requestError(err error) error {
	if errors.Is(err, errForeignListener) {
		return fmt.Errorf("server %s (%s): not asked: %w; a server file counts only for a server its own user runs on this host", s.URL, s.File, unwrapURL(err))
	}
	return fmt.Errorf("server %s (%s) does not answer: %w", s.URL, s.File, unwrapURL(err))
}

// unwrapURL drops net/http's "Get URL:" wrapping, which repeats the URL.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// TokenPattern is one entry of GPUMEM_SERVER_TOKEN_URLS: the servers a given
// token is meant for, as a URL prefix whose port may be "*" (JupyterHub's
// single-user servers each listen on a port of their own, under one path
// prefix such as /user/).
type TokenPattern struct {
	scheme, host, port, path string
}

// ParseTokenPattern parses one entry of GPUMEM_SERVER_TOKEN_URLS, such as
// http://127.0.0.1:*/user/ or http://127.0.0.1:8888/.
func ParseTokenPattern(s string) (TokenPattern, error) {
	p, ok := splitServerURL(s)
	if !ok || (p.scheme != "http" && p.scheme != "https" && p.scheme != "http+unix") {
		return TokenPattern{}, fmt.Errorf("server token URL %q: want SCHEME://HOST:PORT/PATH (http or https; PORT may be *), or http+unix://SOCKET/PATH", s)
	}
	return p, nil
}

// ParseTokenPatterns parses a list of them (GPUMEM_SERVER_TOKEN_URLS:
// separated by commas or spaces).
func ParseTokenPatterns(list string) ([]TokenPattern, error) {
	var out []TokenPattern
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' }) {
		p, err := ParseTokenPattern(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Matches reports whether the server at serverURL is one the pattern names:
// the same scheme and host (case aside), the same port or any for "*", and a
// path under the pattern's.
func (p TokenPattern) Matches(serverURL string) bool {
	u, ok := splitServerURL(serverURL)
	if !ok {
		return false
	}
	return u.scheme == p.scheme && strings.EqualFold(u.host, p.host) && (p.port == "*" || p.port == u.port) &&
		strings.HasPrefix(u.path, p.path)
}

// String is the pattern as given, normalized.
func (p TokenPattern) String() string {
	host := p.host
	if p.port != "" {
		host = net.JoinHostPort(p.host, p.port)
	}
	return p.scheme + "://" + host + p.path
}

// splitServerURL cuts a server URL into scheme, host, port (the scheme's
// default when none is written; "" for http+unix) and a path ending in "/".
func splitServerURL(s string) (TokenPattern, bool) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || scheme == "" {
		return TokenPattern{}, false
	}
	scheme = strings.ToLower(scheme)
	hostport, path, _ := strings.Cut(rest, "/")
	path = "/" + path
	if !strings.HasSuffix(path, "/") {
		path += "/"
	}
	p := TokenPattern{scheme: scheme, path: path}
	if scheme == "http+unix" {
		p.host = hostport
		return p, hostport != ""
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = strings.Trim(hostport, "[]"), map[string]string{"http": "80", "https": "443"}[scheme]
	}
	if host == "" || (port != "*" && port == "") {
		return TokenPattern{}, false
	}
	p.host, p.port = host, port
	return p, true
}

// tokenMeantFor reports whether GPUMEM_SERVER_TOKEN may be sent to the
// server at serverURL.
func tokenMeantFor(patterns []TokenPattern, serverURL string) bool {
	for _, p := range patterns {
		if p.Matches(serverURL) {
			return true
		}
	}
	return false
}
