package api

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// vouchCases is testdata/vouch-cases.json, the table the Python twins run too.
type vouchCases struct {
	Path  string            `json:"path"`
	Names map[string]string `json:"names"`
	Cases []struct {
		Name   string `json:"name"`
		Self   uint32 `json:"self"`
		Socket struct {
			Type string `json:"type"`
			UID  uint32 `json:"uid"`
			Mode string `json:"mode"`
		} `json:"socket"`
		Dir struct {
			UID  uint32 `json:"uid"`
			Mode string `json:"mode"`
		} `json:"dir"`
		Peer *uint32 `json:"peer"`
		Want string  `json:"want"`
	} `json:"cases"`
}

func loadVouchCases(t *testing.T) vouchCases {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "vouch-cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vc vouchCases
	if err := json.Unmarshal(b, &vc); err != nil {
		t.Fatalf("testdata/vouch-cases.json: %v", err)
	}
	return vc
}

func octal(t *testing.T, s string) uint32 {
	t.Helper()
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		t.Fatalf("mode %q: %v", s, err)
	}
	return uint32(n)
}

// A socket served by the user or by root is accepted; by anyone else, or
// through a link, a dir others control: refused with its one sentence.
func TestVouchCases(t *testing.T) {
	vc := loadVouchCases(t)
	if len(vc.Cases) < 10 {
		t.Fatalf("only %d cases in testdata/vouch-cases.json", len(vc.Cases))
	}
	types := map[string]uint32{"socket": unix.S_IFSOCK, "symlink": unix.S_IFLNK, "file": unix.S_IFREG}
	for _, tc := range vc.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			typ, ok := types[tc.Socket.Type]
			if !ok {
				t.Fatalf("socket type %q", tc.Socket.Type)
			}
			peerAsked := false
			v := voucher{
				self: tc.Self,
				lstat: func(p string) (fileFacts, error) {
					if p != vc.Path {
						t.Errorf("lstat %s, want %s", p, vc.Path)
					}
					return fileFacts{uid: tc.Socket.UID, mode: typ | octal(t, tc.Socket.Mode)}, nil
				},
				stat: func(p string) (fileFacts, error) {
					if p != filepath.Dir(vc.Path) {
						t.Errorf("stat %s, want %s", p, filepath.Dir(vc.Path))
					}
					return fileFacts{uid: tc.Dir.UID, mode: unix.S_IFDIR | octal(t, tc.Dir.Mode)}, nil
				},
				peer: func(net.Conn) (uint32, error) {
					peerAsked = true
					if tc.Peer == nil {
						t.Error("the peer asked for, where the case has none")
						return 0, errors.New("no peer")
					}
					return *tc.Peer, nil
				},
				name: func(uid uint32) string { return vc.Names[strconv.FormatUint(uint64(uid), 10)] },
			}
			err := v.checkPath(vc.Path)
			if err == nil && tc.Peer != nil {
				err = v.checkPeer(vc.Path, nil)
			}
			got := ""
			if err != nil {
				var ue *UntrustedError
				if !errors.As(err, &ue) {
					t.Fatalf("error %v (%T), want an *UntrustedError", err, err)
				}
				got = err.Error()
			}
			if got != tc.Want {
				t.Errorf("got  %q\nwant %q", got, tc.Want)
			}
			if tc.Want == "" && tc.Peer != nil && !peerAsked {
				t.Error("accepted without checking the peer")
			}
		})
	}
}

// A Client whose socket is served by another uid sends nothing on the
// connection: the peer is checked on the connection itself, before any
// request.
func TestClientRefusesUntrustedPeer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultSocketName)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(got)
				return
			}
			b, _ := io.ReadAll(c) // until the client closes
			_ = c.Close()
			got <- b
		}
	}()
	v := systemVoucher()
	v.peer = func(net.Conn) (uint32, error) { return 1001, nil }
	v.name = func(uint32) string { return "bob" }
	c := newClient(path, v)
	err = c.Healthz(ctxTimeout(t))
	c.Close()
	var ue *UntrustedError
	if !errors.As(err, &ue) || ue.Path != path {
		t.Fatalf("Healthz: %v, want an *UntrustedError for %s", err, path)
	}
	want := "not using " + path + ": it is served by uid 1001 (bob), not by root or you; unset GPUMEM_SOCKET or point it at your own daemon"
	if err.Error() != want {
		t.Errorf("error\n%q, want\n%q", err, want)
	}
	if b := <-got; len(b) != 0 {
		t.Errorf("the untrusted server got %q", b)
	}
	_ = ln.Close()
	for range got {
	}
}

// The system's facts: this process (root in the tests) serves a socket in
// its own private dir, and the Client uses it; a planted link in the
// socket's place is refused before any connect; a missing socket is still
// "no daemon".
func TestClientVouchesForRealSocket(t *testing.T) {
	ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
	if err := newTestClient(t, ts.path).Healthz(ctxTimeout(t)); err != nil {
		t.Fatalf("Healthz of this process's own daemon: %v", err)
	}
	link := filepath.Join(filepath.Dir(ts.path), "link.sock")
	if err := os.Symlink(ts.path, link); err != nil {
		t.Fatal(err)
	}
	err := newTestClient(t, link).Healthz(ctxTimeout(t))
	var ue *UntrustedError
	if !errors.As(err, &ue) || ue.Reason != "it is a symbolic link, not the socket itself" {
		t.Errorf("Healthz through a link: %v, want refused as a symbolic link", err)
	}
	missing := filepath.Join(t.TempDir(), "none.sock")
	if err := newTestClient(t, missing).Healthz(ctxTimeout(t)); !errors.Is(err, ErrNoDaemon) || !errors.Is(err, syscall.ENOENT) {
		t.Errorf("Healthz of a missing socket: %v, want ErrNoDaemon", err)
	}
}

// An open dir (as /tmp) is refused with the system's own stat of it.
func TestClientRefusesOpenDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, DefaultSocketName)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = newTestClient(t, path).Healthz(ctxTimeout(t))
	want := "not using " + path + ": its dir " + dir + " is writable by group or others (mode 1777); unset GPUMEM_SOCKET or point it at your own daemon"
	if err == nil || err.Error() != want {
		t.Errorf("Healthz in an open dir: %v, want %q", err, want)
	}
}

// BenchmarkVouch is what vouching adds to each new connection: the two
// stats and SO_PEERCRED on a connection made once.
func BenchmarkVouch(b *testing.B) {
	path := filepath.Join(b.TempDir(), DefaultSocketName)
	ln, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	v := systemVoucher()
	for b.Loop() {
		if err := v.checkPath(path); err != nil {
			b.Fatal(err)
		}
		if err := v.checkPeer(path, c); err != nil {
			b.Fatal(err)
		}
	}
}
