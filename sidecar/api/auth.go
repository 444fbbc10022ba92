package api

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of a connection, as the kernel saw it
// when it connected (SO_PEERCRED). PID is 0 when the peer lives in a pid
// namespace the daemon cannot see.
type Peer struct {
	PID int
	UID uint32
	GID uint32
}

type peerKey struct{}

// peerResult is what ConnContext stashes: the peer, or why it is unknown.
type peerResult struct {
	peer Peer
	err  error
}

// PeerFromContext returns the caller of a request served by Server, for
// backends that log who asked for what.
func PeerFromContext(ctx context.Context) (Peer, bool) {
	r, ok := ctx.Value(peerKey{}).(peerResult)
	if !ok || r.err != nil {
		return Peer{}, false
	}
	return r.peer, true
}

// withPeer is http.Server.ConnContext: it reads SO_PEERCRED once per connection.
func withPeer(ctx context.Context, c net.Conn) context.Context {
	peer, err := peerCred(c)
	return context.WithValue(ctx, peerKey{}, peerResult{peer: peer, err: err})
}

func peerCred(c net.Conn) (Peer, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Peer{}, fmt.Errorf("connection is %T, not a unix socket", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	var (
		cred    *unix.Ucred
		credErr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("peer credentials: SO_PEERCRED: %w", credErr)
	}
	return Peer{PID: int(cred.Pid), UID: cred.Uid, GID: cred.Gid}, nil
}

// access is what an endpoint requires of its caller.
type access int

const (
	// accessAnyone: any caller the mode admits (shared: every local user).
	accessAnyone access = iota
	// accessKernel: admins and kernel callers.
	accessKernel
	// accessOwnKernel: admins and the kernel named in the path.
	accessOwnKernel
	// accessAdmin: admins only.
	accessAdmin
)

// role is who a caller is, for authorization.
type role int

const (
	roleNone role = iota
	roleKernel
	roleAdmin
)

// caller is an identified peer.
type caller struct {
	peer     Peer
	role     role
	kernelID string // for roleKernel
}

// kernelLookup is Backend.KernelOfPID.
type kernelLookup func(ctx context.Context, pid int) (kernelID string, ownerUID uint32, ok bool)

// identify decides a peer's role. It asks the backend only for callers that
// are neither root nor the daemon's user in shared mode.
func identify(ctx context.Context, mode Mode, daemonUID uint32, peer Peer, kernelOf kernelLookup) caller {
	c := caller{peer: peer}
	if peer.UID == 0 || peer.UID == daemonUID {
		c.role = roleAdmin
		return c
	}
	if mode != ModeShared || peer.PID <= 0 {
		return c
	}
	id, owner, ok := kernelOf(ctx, peer.PID)
	// The uid must match the kernel's owner: a process of another user that
	// got a kernel process's pid after it exited is not that kernel.
	if ok && id != "" && owner == peer.UID {
		c.role = roleKernel
		c.kernelID = id
	}
	return c
}

// authorize says whether c may use an endpoint requiring a; pathKernelID is
// the {id} of the path for accessOwnKernel. The error is the 403 message.
func authorize(mode Mode, c caller, a access, pathKernelID string) error {
	if c.role == roleAdmin {
		return nil
	}
	if mode != ModeShared {
		return fmt.Errorf("uid %d may not use this daemon's socket (private mode: only its own user and root)", c.peer.UID)
	}
	switch a {
	case accessAnyone:
		return nil
	case accessKernel:
		if c.role == roleKernel {
			return nil
		}
	case accessOwnKernel:
		if c.role == roleKernel && c.kernelID == pathKernelID {
			return nil
		}
		if c.role == roleKernel {
			return fmt.Errorf("a process of kernel %s may act on its own kernel only", c.kernelID)
		}
	case accessAdmin:
		if c.role == roleKernel {
			return fmt.Errorf("a process of kernel %s may not list all notebooks: use GET /api/v1/kernels/%s and /api/v1/users", c.kernelID, c.kernelID)
		}
	}
	return fmt.Errorf("uid %d pid %d is neither root, the daemon's user, nor a process of a Jupyter kernel", c.peer.UID, c.peer.PID)
}

// browserHeaders are headers only browsers (or things pretending to be one) send.
var browserHeaders = []string{"Origin", "Referer", "Sec-Fetch-Site", "Sec-Fetch-Mode"}

// checkNotBrowser refuses requests that a browser could have made through a
// local proxy: the API has no CORS and wants none.
func checkNotBrowser(r *http.Request) error {
	for _, h := range browserHeaders {
		if _, ok := r.Header[h]; ok {
			return fmt.Errorf("requests with a %s header are refused: the gpumem API is not for browsers", h)
		}
	}
	switch r.Host {
	case "", "localhost", SocketHost:
		return nil
	}
	return fmt.Errorf("host %q is refused: use %q", r.Host, SocketHost)
}
