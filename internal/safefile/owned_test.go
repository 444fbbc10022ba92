package safefile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestOpenOwned(t *testing.T) {
	dir := t.TempDir()
	me := uint32(os.Geteuid())
	good := filepath.Join(dir, "snap.pickle")
	if err := os.WriteFile(good, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, info, err := OpenOwned(good, me, 10)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 20)
	n, _ := f.Read(b)
	f.Close()
	if string(b[:n]) != "0123456789" || info.UID != me {
		t.Errorf("read %q info %+v", b[:n], info)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	linkedDir := filepath.Join(dir, "linkdir")
	if err := os.Symlink(dir, linkedDir); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path string
		uid        uint32
		max        int64
		is         error
		has        string
	}{
		{"another user's file", good, me + 1, 10, ErrNotOwner, "belongs to uid"},
		{"too large", good, me, 9, ErrTooLarge, "at most 9"},
		{"a FIFO never blocks", fifo, me, 10, ErrNotRegular, "a FIFO"},
		{"a directory", dir, me, 10, ErrNotRegular, "a directory"},
		{"a symlink", link, me, 10, nil, "symlink"},
		{"a symlinked directory", filepath.Join(linkedDir, "snap.pickle"), me, 10, nil, "symlink"},
		{"a relative path", "snap.pickle", me, 10, nil, "not an absolute path"},
		{"missing", filepath.Join(dir, "nope"), me, 10, os.ErrNotExist, "nope"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, _, err := OpenOwned(c.path, c.uid, c.max)
			if err == nil {
				f.Close()
				t.Fatal("no error")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %v is not %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.has) {
				t.Errorf("error %q lacks %q", err, c.has)
			}
		})
	}
}
