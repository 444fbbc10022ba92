package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/gpumem/gpumem/sidecar/discovery"
)

// Discovery's schedule and what it may follow: scans run on a goroutine of
// their own, and a file is followed only when a process of its owner
// vouches for it, within a cap per user.

// discover runs the scans, apart from sampling: whenever the watcher says
// the dirs may have changed, one at a time. Discovery reads files and asks
// servers that users control, and a slow one must not hold up sampling,
// and with it reclaim and culling: each scan is bounded (scanDeadline,
// and serverDeadline per server, which backs off from a server that
// failed). After each scan the socket is served anew if its file went.
func (d *Daemon) discover(ctx context.Context, w *dirWatcher, sock *socketKeeper) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.C():
		}
		d.scan(ctx)
		if again, err := sock.check(ctx); err != nil {
			d.problem(fmt.Errorf("socket %s is gone and cannot be made again: %w", d.cfg.SocketPath, err))
		} else if again {
			d.log.Warn().Str("socket", d.cfg.SocketPath).Msg("the socket was removed (its dir deleted?): serving it again")
		}
	}
}

// Discovery's deadlines: a whole scan, and one server's /api/sessions (a
// real server answers in milliseconds).
const (
	scanDeadline   = 30 * time.Second
	serverDeadline = 2 * time.Second
)

// maxFollowedPerUser bounds the kernels of one user (other than the
// daemon's own) that the daemon follows: each costs a connection and a
// goroutine, and a user who starts thousands must not cost the others
// their daemon. A proven kernel beyond it is listed nowhere until one of
// that user's kernels goes.
const maxFollowedPerUser = 256

// followedPerUserLocked counts the kernels followed per file owner.
func (d *Daemon) followedPerUserLocked() map[uint32]int {
	n := map[uint32]int{}
	for _, ks := range d.kernels {
		n[ks.fileUID]++
	}
	return n
}

// mayFollowLocked says whether to start following k, found in a scan: its
// process is proven, or a process running as the file's owner serves its
// port or names it (a kernel starting, or one proven later by a reply
// signed with its key); and its owner, if another user than the daemon's,
// has fewer than maxFollowedPerUser kernels followed; and, in another
// user's dir, no other daemon serves that dir.
func (d *Daemon) mayFollowLocked(k discovery.Kernel, followed map[uint32]int) bool {
	if !k.PIDProven && !k.PIDUIDMatch {
		return false
	}
	if k.FileUID != d.selfUID && followed[k.FileUID] >= maxFollowedPerUser {
		d.problem(fmt.Errorf("uid %d has %d kernels followed, the most for one user: its other kernels are not followed",
			k.FileUID, maxFollowedPerUser))
		return false
	}
	return k.Pod != nil || d.disc.locks.hold(filepath.Dir(k.ConnectionFile))
}
