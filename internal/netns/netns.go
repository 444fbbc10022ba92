// Package netns opens network connections inside another network
// namespace: the one a Kubernetes pod's processes share, which the daemon,
// running in the host's, cannot reach by address. It owns nothing else.
//
// A socket belongs to the network namespace of the thread that created it,
// for its whole life. Dial therefore creates the socket on a goroutine
// locked to its OS thread after setns(2) into the target namespace, then
// moves the thread back. If the thread cannot be moved back it is never
// unlocked: the Go runtime then ends that thread with the goroutine, so no
// other goroutine ever runs in the wrong namespace.
//
// setns(2) into a network namespace needs CAP_SYS_ADMIN; opening another
// process's /proc/<pid>/ns/net needs ptrace access to it (CAP_SYS_PTRACE
// for another user's).
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"

	"golang.org/x/sys/unix"
)

// Dial connects to addr ("host:port" with an IP literal host) on network
// ("tcp", "tcp4" or "tcp6") from inside
// the network namespace that nsPath names (/proc/<pid>/ns/net, or a
// descriptor's /proc/self/fd/N). A host name is refused: it would be
// resolved with this process's resolver and, with several addresses, dialed
// from other goroutines, outside the namespace.
func Dial(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	if err := checkAddr(network, addr); err != nil {
		return nil, err
	}
	nsFD, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("network namespace %s: %w", nsPath, err)
	}
	defer unix.Close(nsFD)
	return DialFD(ctx, nsFD, network, addr)
}

// DialFD is Dial into the namespace of an open descriptor (of
// /proc/<pid>/ns/net); the caller keeps and closes it.
func DialFD(ctx context.Context, nsFD int, network, addr string) (net.Conn, error) {
	if err := checkAddr(network, addr); err != nil {
		return nil, err
	}
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		conn, err, restored := dialIn(ctx, nsFD, network, addr)
		if restored {
			runtime.UnlockOSThread()
		}
		// Not restored: the goroutine ends locked, and the runtime ends
		// its thread.
		done <- result{conn, err}
	}()
	r := <-done
	return r.conn, r.err
}

// dialIn runs on a locked thread: it enters the namespace, dials, and moves
// the thread back. restored is false when the thread may still be in the
// target namespace.
func dialIn(ctx context.Context, nsFD int, network, addr string) (conn net.Conn, err error, restored bool) {
	self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("this thread's network namespace: %w", err), true
	}
	defer unix.Close(self)
	if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
		// setns failed: the thread never left.
		return nil, fmt.Errorf("entering the network namespace (needs CAP_SYS_ADMIN): %w", err), true
	}
	// One address, no resolver: net.Dialer creates and connects the
	// socket on this goroutine, hence on this thread.
	d := net.Dialer{FallbackDelay: -1}
	conn, err = d.DialContext(ctx, network, addr)
	if rerr := unix.Setns(self, unix.CLONE_NEWNET); rerr != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("leaving the network namespace: %w", rerr), false
	}
	return conn, err, true
}

// ErrHostName is returned for an address whose host is not an IP literal.
var ErrHostName = errors.New("host is not an IP address")

func checkAddr(network, addr string) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		// A unix socket's path resolves in the mount namespace, not the
		// network one: this package cannot reach it.
		return fmt.Errorf("network %q: only tcp is dialed in another network namespace", network)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if net.ParseIP(host) == nil {
		return fmt.Errorf("%s: %w", addr, ErrHostName)
	}
	return nil
}
