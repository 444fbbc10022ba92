package safefile

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A stamp vouches for a file's bytes only when the file's last change is
// over the margin older than the stamp: within it, a second write in the
// same clock tick would carry the same times.
func TestStampSettled(t *testing.T) {
	st := unix.Stat_t{Mode: unix.S_IFREG | 0o600, Size: 10,
		Mtim: unix.NsecToTimespec(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())}
	st.Ctim = st.Mtim
	changed := time.Unix(st.Ctim.Unix())
	for _, c := range []struct {
		after time.Duration
		want  bool
	}{{0, false}, {stampMargin / 2, false}, {stampMargin, false}, {stampMargin + time.Millisecond, true}, {time.Hour, true}} {
		if got := stampOf(&st, changed.Add(c.after)).settled; got != c.want {
			t.Errorf("stamped %v after the change: settled %v, want %v", c.after, got, c.want)
		}
	}
	// A modification time in the future (set by touch) settles nothing.
	future := st
	future.Mtim = unix.NsecToTimespec(changed.Add(time.Hour).UnixNano())
	if stampOf(&future, changed.Add(time.Minute)).settled {
		t.Error("a modification time an hour ahead: settled")
	}
}

// Unchanged says yes only for the very file stamped, as it was: any
// write (the same bytes too), chmod, chown, new link, rename over it,
// link or removal in its place, or a new owner of its dir says no, as
// does a stamp that is not settled.
func TestUnchanged(t *testing.T) {
	write := func(t *testing.T) (string, Stamp) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), "runtime")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "kernel-x.json")
		if err := os.WriteFile(p, []byte(`{"key":"a"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, s, err := ReadStamped(p, 1<<10)
		if err != nil {
			t.Fatal(err)
		}
		if s.settled {
			t.Fatal("a file written just now: its stamp is settled")
		}
		if s.Unchanged(p) {
			t.Fatal("an unsettled stamp vouched for its file")
		}
		// As if read over the margin after it was written.
		s.settled = true
		if !s.Unchanged(p) {
			t.Fatal("an untouched file: changed")
		}
		return p, s
	}
	// changeLater changes the file until its change time moves: a change
	// in the tick of the stamp keeps it (what the margin is for).
	changeLater := func(t *testing.T, p string, s Stamp, change func() error) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			if err := change(); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil || st.Ctim != s.ctime {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the change time did not move in 5 s")
			}
		}
	}
	cases := map[string]func(p string) error{
		"the same bytes written again": func(p string) error { return os.WriteFile(p, []byte(`{"key":"a"}`), 0o600) },
		"other bytes of the same size": func(p string) error { return os.WriteFile(p, []byte(`{"key":"b"}`), 0o600) },
		"a chmod":                      func(p string) error { return os.Chmod(p, 0o644) },
		"a hard link added":            func(p string) error { return os.Link(p, p+".link"+time.Now().Format("150405.000000000")) },
		"renamed over": func(p string) error {
			if err := os.WriteFile(p+".new", []byte(`{"key":"a"}`), 0o600); err != nil {
				return err
			}
			return os.Rename(p+".new", p)
		},
		"a link in its place": func(p string) error {
			if err := os.Rename(p, p+".old"); err != nil && !os.IsNotExist(err) {
				return err
			}
			os.Remove(p)
			return os.Symlink(p+".old", p)
		},
		"removed": func(p string) error {
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return err
			}
			return nil
		},
	}
	for name, change := range cases {
		t.Run(name, func(t *testing.T) {
			p, s := write(t)
			changeLater(t, p, s, func() error { return change(p) })
			if s.Unchanged(p) {
				t.Errorf("%s: unchanged", name)
			}
		})
	}
	t.Run("its dir given to another user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("chown needs root")
		}
		p, s := write(t)
		if err := os.Chown(filepath.Dir(p), 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if s.Unchanged(p) {
			t.Error("a dir of another owner: unchanged")
		}
	})
}
