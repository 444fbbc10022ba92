package api

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/user"
	"slices"
	"strconv"
	"strings"

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
	// accessOwnOrphans: accessOwnKernel, the kernel being one of the
	// report's or one shut down since whose processes reclaim left
	// running (orphanKernels).
	accessOwnOrphans
)

// role is who a caller is, for authorization.
type role int

const (
	roleNone role = iota
	roleUser
	roleAdmin
)

// caller is an identified peer, and for an endpoint of one kernel the
// kernel its path names (pickKernel).
type caller struct {
	peer   Peer
	role   role
	user   string    // for roleUser: the caller's user name
	kernel KernelRef // for accessOwnKernel: the kernel acted on
}

// KernelRef is the one kernel a request acts on. A kernel id is what
// callers name, but it is no identity: it is public (argv, /metrics), and
// anyone may name a connection file after another's kernel. The connection
// file is the identity, and the report's notebook of that file (its user
// from the kernel's proven process) says whose it is.
type KernelRef struct {
	ID             string
	ConnectionFile string
	// Notebook is the last report's entry of the kernel.
	Notebook attribution.Notebook
}

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

// authorize says whether c may use an endpoint requiring a. The error is
// the 403 message. For accessOwnKernel it admits every user: which kernel,
// if any, is theirs is pickKernel's to say.
func authorize(mode Mode, c caller, a access) error {
	if c.role == roleAdmin {
		return nil
	}
	if mode != ModeShared {
		return fmt.Errorf("uid %d may not use this daemon's socket (private mode: only its own user and root)", c.peer.UID)
	}
	switch a {
	case accessAnyone:
		return nil
	case accessUser, accessOwnKernel, accessOwnOrphans:
		if c.role == roleUser {
			return nil
		}
	}
	return fmt.Errorf("uid %d pid %d may not use this endpoint", c.peer.UID, c.peer.PID)
}

// pickKernel chooses the kernel a request for kernel id acts on, among the
// report's notebooks: those of that id (and of connection file file, when
// the request names one, as ?connection_file=), and of those only the
// caller's own unless the caller is an admin. None: 403 for a user (the
// same whether or not another user's kernel has that id), 404 for an
// admin. More than one: 409, naming only the candidates the caller may
// see, and how to name one. It returns the HTTP status of a refusal (0 when
// ref is chosen) and its message.
func pickKernel(c caller, id, file string, notebooks []attribution.Notebook) (KernelRef, int, string) {
	var mine []attribution.Notebook
	for _, nb := range notebooks {
		if nb.KernelID != id || (file != "" && nb.ConnectionFile != file) {
			continue
		}
		if c.role == roleAdmin || (c.role == roleUser && nb.User == c.user) {
			mine = append(mine, nb)
		}
	}
	switch {
	case len(mine) == 1:
		return KernelRef{ID: id, ConnectionFile: mine[0].ConnectionFile, Notebook: mine[0]}, 0, ""
	case len(mine) > 1:
		var files []string
		for _, nb := range mine {
			f := nb.ConnectionFile
			if c.role == roleAdmin && nb.User != "" {
				f += " (user " + nb.User + ")"
			}
			files = append(files, f)
		}
		return KernelRef{}, http.StatusConflict, fmt.Sprintf("kernel id %s names %d kernels: %s; name one with ?connection_file=PATH",
			id, len(mine), strings.Join(files, ", "))
	case c.role == roleUser:
		return KernelRef{}, http.StatusForbidden, fmt.Sprintf("kernel %s is not user %s's: a user may see and act on their own kernels only", id, c.user)
	case file != "":
		return KernelRef{}, http.StatusNotFound, fmt.Sprintf("kernel %s with connection file %s is not known to the daemon: list kernels with GET /api/v1/kernels", id, file)
	}
	return KernelRef{}, http.StatusNotFound, fmt.Sprintf("kernel %s is not known to the daemon: list kernels with GET /api/v1/notebooks", id)
}

// ownView is what a user may see of a report: their own notebooks and
// other processes, the GPUs, and no warnings (they name others' files).
// Others appear only as per-user totals (GET /api/v1/users).
func ownView(rep attribution.Report, user string) attribution.Report {
	out := attribution.Report{GPUs: slices.Clone(rep.GPUs), Notebooks: []attribution.Notebook{}, Other: []attribution.OtherProcess{},
		Schema: rep.Schema, View: "own", Users: rep.Users}
	// Other users' notebooks and processes are theirs: on each GPU they
	// are shown as one holder per user.
	for i := range out.GPUs {
		out.GPUs[i].Holders = attribution.HoldersFor(out.GPUs[i], user)
		out.GPUs[i].HoldersByUser = rep.GPUs[i].HoldersByUser
	}
	for _, nb := range rep.Notebooks {
		if nb.User == user {
			out.Notebooks = append(out.Notebooks, nb)
		}
	}
	out.Alerts = attribution.AlertsFor(rep, user)
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
