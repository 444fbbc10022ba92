package discovery

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// userDirsFixture builds a /proc tree, a passwd file and homes under a temp
// dir. As root it gives the user's files to uid 5000 and a stranger's to
// uid 5001; otherwise the user is the caller and the stranger root (a
// root-owned dir reached through a symlink).
type userDirsFixture struct {
	t        *testing.T
	base     string
	proc     string
	uid      int
	stranger string // a dir the user does not own
}

func newUserDirsFixture(t *testing.T) *userDirsFixture {
	f := &userDirsFixture{t: t, base: t.TempDir()}
	f.proc = filepath.Join(f.base, "proc")
	f.uid = os.Getuid()
	if f.uid == 0 {
		f.uid = 5000
		f.stranger = f.mkdir("stranger/runtime", 5001)
	} else {
		f.stranger = filepath.Join(f.base, "stranger")
		if err := os.Symlink("/usr", f.stranger); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// mkdir makes base/rel (and parents) owned by uid (when root).
func (f *userDirsFixture) mkdir(rel string, uid int) string {
	f.t.Helper()
	p := filepath.Join(f.base, rel)
	if err := os.MkdirAll(p, 0o700); err != nil {
		f.t.Fatal(err)
	}
	if os.Getuid() == 0 {
		for d := p; d != f.base; d = filepath.Dir(d) {
			if err := os.Lchown(d, uid, uid); err != nil {
				f.t.Fatal(err)
			}
		}
	}
	return p
}

// process adds /proc/<pid> with argv, environ and cwd, owned by the user.
func (f *userDirsFixture) process(pid int, argv []string, env []string, cwd string) {
	f.t.Helper()
	dir := filepath.Join(f.proc, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	write := func(name string, parts []string) {
		data := strings.Join(parts, "\x00")
		if len(parts) > 0 {
			data += "\x00"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			f.t.Fatal(err)
		}
	}
	write("cmdline", argv)
	write("environ", env)
	if cwd != "" {
		if err := os.Symlink(cwd, filepath.Join(dir, "cwd")); err != nil {
			f.t.Fatal(err)
		}
	}
	if os.Getuid() == 0 {
		if err := os.Lchown(dir, f.uid, f.uid); err != nil {
			f.t.Fatal(err)
		}
	}
}

func TestFindUserRuntimeDirs(t *testing.T) {
	f := newUserDirsFixture(t)
	uid := strconv.Itoa(f.uid)
	byArgv := f.mkdir("alice/custom-runtime", f.uid)
	byRelArgv := f.mkdir("alice/work/rt", f.uid)
	byEnv := f.mkdir("alice/hub-runtime", f.uid)
	byHomeEnv := f.mkdir("alice/envhome/.local/share/jupyter/runtime", f.uid)
	byPasswd := f.mkdir("alice/.local/share/jupyter/runtime", f.uid)

	f.process(10, []string{"/usr/bin/python3", "-m", "ipykernel_launcher", "-f", filepath.Join(byArgv, "kernel-1.json")}, nil, "")
	f.process(11, []string{"python", "-m", "ipykernel_launcher", "-f=rt/kernel-2.json"}, nil, filepath.Join(f.base, "alice", "work"))
	f.process(12, []string{"/venv/bin/python3", "/venv/bin/jupyterhub-singleuser", "--port=4242"},
		[]string{"JUPYTERHUB_USER=alice", "JUPYTER_RUNTIME_DIR=" + byEnv}, "")
	f.process(13, []string{"python3", "-m", "jupyter_server"}, []string{"HOME=" + filepath.Join(f.base, "alice", "envhome")}, "")
	// A kernel whose file lies in a dir its user does not own.
	f.process(14, []string{"python3", "-m", "ipykernel_launcher", "-f", filepath.Join(f.stranger, "kernel-3.json")}, nil, "")
	// A kernel of an account below MinUID (root's own, a service's): left
	// out. Only as root can the fixture make one.
	if os.Getuid() == 0 {
		rootDir := f.mkdir("root-kernels", 0)
		f.process(16, []string{"python3", "-m", "ipykernel_launcher", "-f", filepath.Join(rootDir, "kernel-4.json")}, nil, "")
		if err := os.Lchown(filepath.Join(f.proc, "16"), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Neither a kernel nor a server: its environment is not read.
	f.process(15, []string{"bash"}, []string{"JUPYTER_RUNTIME_DIR=" + f.mkdir("alice/ignored", f.uid)}, "")

	passwd := filepath.Join(f.base, "passwd")
	lines := []string{
		"root:x:0:0:root:/root:/bin/bash",
		"alice:x:" + uid + ":" + uid + "::" + filepath.Join(f.base, "alice") + ":/bin/bash",
		"carol:x:" + strconv.Itoa(f.uid+7) + ":100::" + filepath.Join(f.base, "carol") + ":/bin/bash", // not logged in yet
		"daemon:x:1:1::/usr/sbin:/usr/sbin/nologin",
		"nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin",
		"broken line",
	}
	if err := os.WriteFile(passwd, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := UserDirsOptions{Procs: &procs.FS{Root: f.proc}, Passwd: passwd, MinUID: uint32(min(f.uid, 1000))}

	got, problems := FindUserRuntimeDirs(opts)
	want := map[string]string{byArgv: "kernel argv", byRelArgv: "kernel argv", byEnv: "server environment",
		byHomeEnv: "server environment", byPasswd: "home"}
	seen := map[string]bool{}
	for _, d := range got {
		seen[d.Path] = true
		if want[d.Path] == "" {
			t.Errorf("unexpected dir %+v", d)
			continue
		}
		if d.UID != uint32(f.uid) {
			t.Errorf("%s: uid %d, want %d", d.Path, d.UID, f.uid)
		}
		// The passwd dir is also reached through no process: From may be
		// either where two sources agree; these five have one each.
		if d.From != want[d.Path] {
			t.Errorf("%s found by %q, want %q", d.Path, d.From, want[d.Path])
		}
	}
	for p := range want {
		if !seen[p] {
			t.Errorf("%s not found; got %+v (problems %v)", p, got, problems)
		}
	}
	var strangerProblem bool
	for _, p := range problems {
		if strings.Contains(p.Error(), "not watched") {
			strangerProblem = true
		}
	}
	if !strangerProblem {
		t.Errorf("the kernel file in a dir of another uid was not reported: %v", problems)
	}

	// Limited to a user who is not alice: nothing of alice's.
	only, problems := FindUserRuntimeDirs(UserDirsOptions{Procs: &procs.FS{Root: f.proc}, Passwd: passwd, MinUID: opts.MinUID, Users: []string{"carol", "nosuch"}})
	if len(only) != 0 {
		t.Errorf("Users [carol]: got %+v, want nothing (carol has no dir yet)", only)
	}
	if len(problems) == 0 || !strings.Contains(fmt.Sprint(problems), "user nosuch: no such account") {
		t.Errorf("an unknown user was not reported: %v", problems)
	}

	// carol logs in later: her runtime dir appears, and the next call finds it.
	carol := f.mkdir("carol/.local/share/jupyter/runtime", f.uid+7)
	got, _ = FindUserRuntimeDirs(opts)
	found := false
	for _, d := range got {
		found = found || d.Path == carol
	}
	if os.Getuid() == 0 && !found {
		t.Errorf("carol's new runtime dir %s not found: %+v", carol, got)
	}
	if os.Getuid() != 0 && found {
		t.Errorf("carol's runtime dir (not hers: not root, so made as uid %d) was accepted", os.Getuid())
	}
}

func TestFindUserRuntimeDirsUnreadable(t *testing.T) {
	got, problems := FindUserRuntimeDirs(UserDirsOptions{Procs: &procs.FS{Root: "/nonexistent/proc"}, Passwd: "/nonexistent/passwd"})
	if len(got) != 0 || len(problems) != 2 {
		t.Fatalf("got %v, problems %v; want none and 2 problems", got, problems)
	}
	for _, p := range problems {
		if !errors.Is(p, os.ErrNotExist) {
			t.Errorf("problem %v does not wrap ErrNotExist", p)
		}
	}
}

func TestJupyterRuntimeDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"JUPYTER_RUNTIME_DIR": "/r", "JUPYTER_DATA_DIR": "/d", "HOME": "/h"}, "/r"},
		{map[string]string{"JUPYTER_DATA_DIR": "/d", "XDG_DATA_HOME": "/x", "HOME": "/h"}, "/d/runtime"},
		{map[string]string{"XDG_DATA_HOME": "/x", "HOME": "/h"}, "/x/jupyter/runtime"},
		{map[string]string{"HOME": "/h", "JUPYTER_PLATFORM_DIRS": "1"}, "/h/.local/share/jupyter/runtime"},
		{map[string]string{}, ""},
	} {
		if got := jupyterRuntimeDir(tc.env); got != tc.want {
			t.Errorf("jupyterRuntimeDir(%v) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestConnectionFileArg(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want string
	}{
		{[]string{"python", "-m", "ipykernel_launcher", "-f", "/r/kernel-a.json"}, "/r/kernel-a.json"},
		{[]string{"python", "-m", "ipykernel_launcher", "--f=/r/kernel-b.json"}, "/r/kernel-b.json"},
		{[]string{"python", "-m", "ipykernel_launcher", "-f", "/r/other.json"}, ""},
		{[]string{"python", "-m", "ipykernel_launcher", "-f"}, ""},
		{[]string{"tail", "-f", "/var/log/syslog"}, ""},
	} {
		if got := connectionFileArg(tc.argv); got != tc.want {
			t.Errorf("connectionFileArg(%q) = %q, want %q", tc.argv, got, tc.want)
		}
	}
}
