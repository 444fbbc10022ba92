package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/user"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/sidecar/attribution"
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
	// accessUser: admins, and in shared mode any local user, who sees only
	// what is theirs (the handler filters) and per-user totals of others.
	accessUser
	// accessOwnKernel: admins, and in shared mode the user owning the
	// kernel named in the path (or a process of that kernel).
	accessOwnKernel
)

// role is who a caller is, for authorization.
type role int

const (
	roleNone role = iota
	roleUser
	roleAdmin
)

// caller is an identified peer.
type caller struct {
	peer Peer
	role role
	user string // for roleUser: the caller's user name
}

// kernelLookup is Backend.KernelOfPID.
type kernelLookup func(ctx context.Context, pid int) (kernelID string, ownerUID uint32, ok bool)

// identify decides a peer's role: root and the daemon's user are admins;
// in shared mode every other local user is a user, named as the report
// names kernels' owners.
func identify(mode Mode, daemonUID uint32, peer Peer, userName func(uint32) string) caller {
	c := caller{peer: peer}
	if peer.UID == 0 || peer.UID == daemonUID {
		c.role = roleAdmin
		return c
	}
	if mode == ModeShared {
		c.role, c.user = roleUser, userName(peer.UID)
	}
	return c
}

// authorize says whether c may use an endpoint requiring a; for
// accessOwnKernel, pathKernelID is the path's {id} and owner the user the
// report names for it ("" when unknown). The error is the 403 message.
// kernelOf (a /proc scan) is asked only when the owner's name does not
// decide: whether the caller is a process of that very kernel.
func authorize(ctx context.Context, mode Mode, c caller, a access, pathKernelID, owner string, kernelOf kernelLookup) error {
	if c.role == roleAdmin {
		return nil
	}
	if mode != ModeShared {
		return fmt.Errorf("uid %d may not use this daemon's socket (private mode: only its own user and root)", c.peer.UID)
	}
	switch a {
	case accessAnyone:
		return nil
	case accessUser:
		if c.role == roleUser {
			return nil
		}
	case accessOwnKernel:
		if c.role == roleUser && ((owner != "" && owner == c.user) || c.isProcessOf(ctx, pathKernelID, kernelOf)) {
			return nil
		}
		if c.role == roleUser {
			return fmt.Errorf("kernel %s is not user %s's: a user may see and act on their own kernels only", pathKernelID, c.user)
		}
	}
	return fmt.Errorf("uid %d pid %d may not use this endpoint", c.peer.UID, c.peer.PID)
}

// isProcessOf reports whether the caller is a process of kernel id. The
// uid must match the kernel's owner: a process of another user that got a
// kernel process's pid after it exited is not that kernel.
func (c caller) isProcessOf(ctx context.Context, id string, kernelOf kernelLookup) bool {
	if c.peer.PID <= 0 || id == "" {
		return false
	}
	got, owner, ok := kernelOf(ctx, c.peer.PID)
	return ok && got == id && owner == c.peer.UID
}

// ownView is what a user may see of a report: their own notebooks and
// other processes, the GPUs, and no warnings (they name others' files).
// Others appear only as per-user totals (GET /api/v1/users).
func ownView(rep attribution.Report, user string) attribution.Report {
	out := attribution.Report{GPUs: rep.GPUs, Notebooks: []attribution.Notebook{}, Other: []attribution.OtherProcess{}, View: "own"}
	for _, nb := range rep.Notebooks {
		if nb.User == user {
			out.Notebooks = append(out.Notebooks, nb)
		}
	}
	for _, o := range rep.Other {
		if o.User == user {
			out.Other = append(out.Other, o)
		}
	}
	for _, lr := range rep.LeftRunning {
		if lr.User == user {
			out.LeftRunning = append(out.LeftRunning, lr)
		}
	}
	for _, h := range rep.Hoarding {
		if h.User == user {
			out.Hoarding = append(out.Hoarding, h)
		}
	}
	return out
}

// lookupUserName names uid as procs names processes' owners: the account
// name, else the number.
func lookupUserName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil && u.Username != "" {
		return u.Username
	}
	return id
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
