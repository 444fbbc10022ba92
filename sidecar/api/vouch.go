package api

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// A client vouches for the daemon before it believes a word of it: whoever
// serves the socket writes the figures and the alerts' text a user reads
// (and acts on), so a socket served by another user must never be used.
// The daemon is trusted when it runs as root or as the client's own user;
// every new connection of a Client is checked, in this order:
//
//  1. the socket file (lstat: never through a symbolic link in its place)
//     belongs to root or to the user;
//  2. its directory belongs to root or to the user, and neither its group
//     nor others may write it. The sticky bit is no exception (a socket
//     directly in /tmp is refused): the daemon itself never listens in such
//     a dir (Listen's checkSocketDir), so nothing that serves one there is a
//     daemon that kept its rules, and the alert file the magics read beside
//     the socket could be anyone's;
//  3. after connecting, the peer's credentials (SO_PEERCRED, taken by the
//     kernel when the server called listen) are root's or the user's.
//
// The third check is the one that cannot be raced: it is made on the very
// connection the requests then travel on, so a socket swapped between the
// first two checks and the connect is still caught. The first two name a
// planted file or a dir others control before anything is sent, and keep
// the answer the same from one connection to the next. The dirs above the
// socket's are not checked (the daemon does not check them either): a swap
// of one of them is caught by the third check.
//
// The Python twins (the server extension's vouch.py and the magics'
// gpumem_magics/vouch.py) keep the same rules and sentences; one table of
// cases, testdata/vouch-cases.json, is run by all three.

// UntrustedError is a socket a Client refused to use: it may be served by
// someone other than root or the user. Its text is the one line the user
// reads, naming the path, what was found and what to do.
type UntrustedError struct {
	Path   string
	Reason string
}

// untrustedAdvice is what to do, the same for every reason: a socket of
// the user's own daemon (or root's) is the only one to use.
const untrustedAdvice = "unset GPUMEM_SOCKET or point it at your own daemon"

func (e *UntrustedError) Error() string {
	return fmt.Sprintf("not using %s: %s; %s", e.Path, e.Reason, untrustedAdvice)
}

// fileFacts are what vouching reads of a file: its owner and its raw
// st_mode (type and permission bits, as stat(2) gives them).
type fileFacts struct {
	uid  uint32
	mode uint32
}

// voucher holds where the facts come from, so that tests (run as root,
// whom every check trusts) can give any owner, mode and peer.
type voucher struct {
	self  uint32
	lstat func(path string) (fileFacts, error)
	stat  func(path string) (fileFacts, error)
	peer  func(c net.Conn) (uint32, error)
	name  func(uid uint32) string
}

// systemVoucher reads the system for the process's effective uid.
func systemVoucher() voucher {
	return voucher{
		self:  uint32(os.Geteuid()),
		lstat: func(p string) (fileFacts, error) { return statFacts(p, unix.Lstat) },
		stat:  func(p string) (fileFacts, error) { return statFacts(p, unix.Stat) },
		peer: func(c net.Conn) (uint32, error) {
			p, err := peerCred(c)
			return p.UID, err
		},
		name: userName,
	}
}

func statFacts(path string, stat func(string, *unix.Stat_t) error) (fileFacts, error) {
	var st unix.Stat_t
	if err := stat(path, &st); err != nil {
		return fileFacts{}, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return fileFacts{uid: st.Uid, mode: st.Mode}, nil
}

// userName is uid's login name, "" when it has none.
func userName(uid uint32) string {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return ""
	}
	return u.Username
}

// trusted reports whether uid may serve this user: root, or the user.
func (v voucher) trusted(uid uint32) bool { return uid == 0 || uid == v.self }

// who names uid as the sentences do: "uid 1001 (bob)".
func (v voucher) who(uid uint32) string {
	if n := v.name(uid); n != "" {
		return fmt.Sprintf("uid %d (%s)", uid, n)
	}
	return fmt.Sprintf("uid %d", uid)
}

// checkPath is checks 1 and 2. A socket that does not exist gives the stat
// error as is (the caller's "no daemon"); a file that is no socket passes,
// and the connect then finds nobody listening.
func (v voucher) checkPath(path string) error {
	fi, err := v.lstat(path)
	if err != nil {
		return err
	}
	refuse := func(format string, args ...any) error {
		return &UntrustedError{Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	if fi.mode&unix.S_IFMT == unix.S_IFLNK {
		return refuse("it is a symbolic link, not the socket itself")
	}
	if !v.trusted(fi.uid) {
		return refuse("the socket file belongs to %s, not to root or you", v.who(fi.uid))
	}
	dir := filepath.Dir(path)
	di, err := v.stat(dir)
	if err != nil {
		return err
	}
	if !v.trusted(di.uid) {
		return refuse("its dir %s belongs to %s, not to root or you", dir, v.who(di.uid))
	}
	if di.mode&0o022 != 0 {
		return refuse("its dir %s is writable by group or others (mode %04o)", dir, di.mode&0o7777)
	}
	return nil
}

// checkPeer is check 3, on the connection itself.
func (v voucher) checkPeer(path string, c net.Conn) error {
	uid, err := v.peer(c)
	if err != nil {
		return fmt.Errorf("gpumem daemon at %s: %w", path, err)
	}
	if !v.trusted(uid) {
		return &UntrustedError{Path: path, Reason: fmt.Sprintf("it is served by %s, not by root or you", v.who(uid))}
	}
	return nil
}

// dial connects to the socket at path after checks 1 and 2, and returns the
// connection once check 3 passed; a refused one is closed.
func (v voucher) dial(ctx context.Context, path string) (net.Conn, error) {
	if err := v.checkPath(path); err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	if err := v.checkPeer(path, c); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}
