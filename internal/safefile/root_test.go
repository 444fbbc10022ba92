package safefile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadInRoot: paths resolve as a process chrooted in root sees them.
// A symlink to an absolute path, or one climbing with "..", must land
// inside root, never on the reader's own file of that name.
func TestReadInRoot(t *testing.T) {
	host := t.TempDir()
	secret := filepath.Join(host, "secret.json")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(host, "root")
	run := filepath.Join(root, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("run/kernel-1.json", "kernel one")
	// The container's own file at the host secret's path.
	write(secret, "container's file")
	links := map[string]string{
		"run/abs.json":     secret,                              // absolute: the container's
		"run/climb.json":   "../../../../../../../../" + secret, // clamped at the root
		"run/hostdir":      host,                                // a dir symlink, absolute
		"run/missing.json": "/etc/no-such-file-gpumem",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(filepath.Join(run, "kernel-fifo.json"), 0o600); err != nil {
		t.Fatal(err)
	}
	rootFD, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rootFD)

	tests := []struct {
		path    string
		want    string
		wantErr error
	}{
		{path: "/run/kernel-1.json", want: "kernel one"},
		{path: "run/kernel-1.json", want: "kernel one"},
		{path: "/run/abs.json", want: "container's file"},
		{path: "/run/climb.json", want: "container's file"},
		{path: "/../../../../" + secret, want: "container's file"},
		{path: "/run/hostdir/secret.json", want: "container's file"},
		{path: "/run/missing.json", wantErr: fs.ErrNotExist},
		{path: "/run/kernel-fifo.json", wantErr: ErrNotRegular},
	}
	for _, tt := range tests {
		got, _, err := ReadInRoot(rootFD, "/proc/7/root", tt.path, 1024)
		if tt.wantErr != nil {
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("ReadInRoot(%s) = %q, %v; want %v", tt.path, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || string(got) != tt.want {
			t.Errorf("ReadInRoot(%s) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
	if _, _, err := ReadInRoot(rootFD, "/proc/7/root", "/run/missing.json", 1024); err == nil ||
		!slices.Contains([]string{"open /proc/7/root/run/missing.json: no such file or directory"}, err.Error()) {
		t.Errorf("error does not name the file as the root's: %v", err)
	}

	names, err := ListInRoot(rootFD, "/proc/7/root", "/run/../../../run")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	want := []string{"abs.json", "climb.json", "hostdir", "kernel-1.json", "kernel-fifo.json", "missing.json"}
	if !slices.Equal(names, want) {
		t.Errorf("ListInRoot = %v, want %v", names, want)
	}
}
