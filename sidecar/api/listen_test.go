package api

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListenSocketMode(t *testing.T) {
	for _, tc := range []struct {
		mode Mode
		want fs.FileMode
	}{
		{ModePrivate, 0o600},
		{ModeShared, 0o666},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			ts := startServer(t, "", tc.mode, &fakeBackend{report: testReport()})
			fi, err := os.Stat(ts.path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != fs.ModeSocket {
				t.Errorf("%s is %v, want a socket", ts.path, fi.Mode().Type())
			}
			if got := fi.Mode().Perm(); got != tc.want {
				t.Errorf("%s mode %#o, want %#o", ts.path, got, tc.want)
			}
			if err := newTestClient(t, ts.path).Healthz(ctxTimeout(t)); err != nil {
				t.Errorf("Healthz: %v", err)
			}
		})
	}
}

func TestListenUnknownMode(t *testing.T) {
	_, err := Listen(t.Context(), filepath.Join(t.TempDir(), "s.sock"), Mode("public"))
	if err == nil || !strings.Contains(err.Error(), `unknown socket mode "public"`) {
		t.Fatalf("Listen with mode public: %v, want unknown socket mode", err)
	}
}

// A socket file left by a daemon that died is replaced.
func TestListenReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultSocketName)
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ul.SetUnlinkOnClose(false)
	if err := ul.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}
	ts := startServer(t, dir, ModePrivate, &fakeBackend{report: testReport()})
	if err := newTestClient(t, ts.path).Healthz(ctxTimeout(t)); err != nil {
		t.Fatalf("Healthz after replacing a stale socket: %v", err)
	}
}

// A socket something answers on is never replaced, whether that is another
// gpumem daemon (which holds the lock) or any other listener.
func TestListenRefusesLiveSocket(t *testing.T) {
	t.Run("gpumem", func(t *testing.T) {
		ts := startServer(t, "", ModePrivate, &fakeBackend{report: testReport()})
		_, err := Listen(t.Context(), ts.path, ModePrivate)
		if err == nil || !strings.Contains(err.Error(), "another gpumem daemon is serving "+ts.path) {
			t.Fatalf("second Listen: %v, want \"another gpumem daemon is serving %s\"", err, ts.path)
		}
		if err := newTestClient(t, ts.path).Healthz(ctxTimeout(t)); err != nil {
			t.Fatalf("first daemon broken by the second Listen: %v", err)
		}
	})
	t.Run("foreign listener", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), DefaultSocketName)
		ul, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer ul.Close()
		_, err = Listen(t.Context(), path, ModePrivate)
		if err == nil || err.Error() != "another gpumem daemon is serving "+path {
			t.Fatalf("Listen over a live socket: %v, want \"another gpumem daemon is serving %s\"", err, path)
		}
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("live socket removed: %v", err)
		}
	})
}

func TestListenRefusesNonSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, DefaultSocketName)
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Listen(t.Context(), path, ModePrivate)
	if err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("Listen over a regular file: %v, want \"is not a socket\"", err)
	}
	if data, err := os.ReadFile(path); err != nil || string(data) != "precious" {
		t.Fatalf("regular file changed: %q, %v", data, err)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(t.Context(), link, ModePrivate); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("Listen over a symlink: %v, want \"is not a socket\"", err)
	}
}

func TestListenPathTooLong(t *testing.T) {
	path := filepath.Join(t.TempDir(), strings.Repeat("x", 120)+".sock")
	_, err := Listen(t.Context(), path, ModePrivate)
	if err == nil || !strings.Contains(err.Error(), "choose a shorter socket path") {
		t.Fatalf("Listen on a long path: %v", err)
	}
}

// After Serve returns, the socket is gone and the client says "no daemon";
// a new daemon can take the same path.
func TestServeRemovesSocket(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, dir, ModePrivate, &fakeBackend{report: testReport()})
	ts.stop()
	if _, err := os.Lstat(ts.path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket after shutdown: %v, want it removed", err)
	}
	if err := newTestClient(t, ts.path).Healthz(ctxTimeout(t)); !errors.Is(err, ErrNoDaemon) {
		t.Fatalf("Healthz after shutdown: %v, want ErrNoDaemon", err)
	}
	ts2 := startServer(t, dir, ModePrivate, &fakeBackend{report: testReport()})
	if err := newTestClient(t, ts2.path).Healthz(ctxTimeout(t)); err != nil {
		t.Fatalf("Healthz of the next daemon: %v", err)
	}
}
