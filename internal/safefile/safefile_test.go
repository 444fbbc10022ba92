package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "kernel-a.json")
	if err := os.WriteFile(regular, []byte(`{"a":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, make([]byte, 2048), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "kernel-fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	toZero := filepath.Join(dir, "jpserver-1.json")
	if err := os.Symlink("/dev/zero", toZero); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(regular, link); err != nil {
		t.Fatal(err)
	}
	// A link to the dir is the caller's choice of dir: followed. Only the
	// file's own name is never a link.
	dirLink := filepath.Join(t.TempDir(), "runtime")
	if err := os.Symlink(dir, dirLink); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		want    string
		wantErr error
		errText string
	}{
		{"regular", regular, `{"a":1}`, nil, ""},
		{"in a linked dir", filepath.Join(dirLink, "kernel-a.json"), `{"a":1}`, nil, ""},
		{"symlink to a regular file", link, "", ErrSymlink, "not followed"},
		{"symlink to a device", toZero, "", ErrSymlink, "not followed"},
		{"over the cap", big, "", ErrTooLarge, "2048 bytes, at most 1024"},
		{"fifo", fifo, "", ErrNotRegular, "a FIFO"},
		{"device", "/dev/zero", "", ErrNotRegular, "a character device"},
		{"directory", dir, "", ErrNotRegular, "a directory"},
		{"directory with a slash", dir + "/", "", ErrNotRegular, "a directory"},
		{"missing", filepath.Join(dir, "nope.json"), "", os.ErrNotExist, "nope.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			var data []byte
			var err error
			go func() { data, _, err = Read(tc.path, 1024); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Read(%s) blocked", tc.path)
			}
			if tc.wantErr == nil {
				if err != nil || string(data) != tc.want {
					t.Fatalf("Read = %q, %v; want %q", data, err, tc.want)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.errText) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("Read error = %v; want %v mentioning %q and the path", err, tc.wantErr, tc.errText)
			}
		})
	}
}

func TestReadOwner(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, info, err := Read(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	if info.UID != uint32(os.Geteuid()) || info.Ino == 0 || info.DirUID != uint32(os.Geteuid()) {
		t.Fatalf("info = %+v, want uid and dir uid %d and an inode", info, os.Geteuid())
	}
}

// TestReadDirOwner: Info names the owner of the dir the file was opened in,
// apart from the file's own, so that a caller can refuse a file of another
// user in someone's dir (a hard link, say).
func TestReadDirOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := filepath.Join(t.TempDir(), "runtime")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "kernel-x.json")
	if err := os.WriteFile(p, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 4343, 4343); err != nil {
		t.Fatal(err)
	}
	_, info, err := Read(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	if info.UID != 4343 || info.DirUID != 4242 {
		t.Fatalf("info = %+v, want uid 4343 in a dir of uid 4242", info)
	}
}

// readUpTo reads to the end or to its limit, whatever the size hint says
// (a file grows after its fstat; a pipe says 0), never past the limit.
func TestReadUpTo(t *testing.T) {
	const limit = 1025 // Read's cap of 1024, and one byte to tell
	for _, tc := range []struct {
		name       string
		size, hint int
		want       int
	}{
		{"empty", 0, 0, 0},
		{"small, hint right", 7, 7, 7},
		{"small, hint 0", 7, 0, 7},
		{"grown since the hint", 900, 10, 900},
		{"at the cap", 1024, 1024, 1024},
		{"one past the cap", 1025, 1024, 1025},
		{"far past the cap, hint 0", 5000, 0, limit},
		{"far past the cap, hint huge", 5000, 1 << 40, limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			content := make([]byte, tc.size)
			for i := range content {
				content[i] = byte(i)
			}
			go func() {
				defer unix.Close(p[1])
				for b := content; len(b) > 0; {
					n, err := unix.Write(p[1], b)
					if err != nil {
						return // the reader stopped at its limit
					}
					b = b[n:]
				}
			}()
			got, err := readUpTo(p[0], int64(tc.hint), limit)
			if err != nil || len(got) != tc.want || !slices.Equal(got, content[:tc.want]) {
				t.Fatalf("readUpTo = %d bytes, %v; want the first %d", len(got), err, tc.want)
			}
		})
	}
}
