package discovery

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// UserDirsOptions says where FindUserRuntimeDirs looks.
type UserDirsOptions struct {
	// Procs reads the process table (nil = /proc).
	Procs *procs.FS
	// Passwd is the account database ("" = /etc/passwd).
	Passwd string
	// MinUID is the lowest uid counted as a person's account (0 = 1000, as
	// Debian's login.defs has it). Dirs of lower uids (root, system
	// accounts) are never returned, whatever found them: the daemon's own
	// runtime dirs and --runtime-dir cover those.
	MinUID uint32
	// Users, when not empty, limits the result to these account names.
	Users []string
}

// UserDir is a runtime dir found for a user.
type UserDir struct {
	Path string
	UID  uint32
	// From says how it was found: "kernel argv", "server environment" or
	// "home".
	From string
}

// FindUserRuntimeDirs finds the Jupyter runtime dirs of every user (each
// account from MinUID up, or those named in Users), for a daemon run as
// root that serves the whole machine:
//   - the dir of each connection file a running process passes with -f
//     (every kernel running now, however it was started);
//   - the runtime dir each running Jupyter server (JupyterLab, Notebook,
//     jupyter_server, JupyterHub's single-user servers) computes from its
//     environment (JUPYTER_RUNTIME_DIR, JUPYTER_DATA_DIR, XDG_DATA_HOME,
//     HOME): there it writes its jpserver-*.json and its kernels' files;
//   - for each account in the passwd file, ~/.local/share/jupyter/runtime,
//     so a user who logs in later is found as soon as that dir exists.
//
// A dir is kept only when it is a directory owned by the user it was found
// for: a dir of someone else could hold files planted for that user. That
// is not a proof of any kernel either: each kernel is still proven by its
// process (the port owner, running as the file's owner, naming the file).
// Problems are returned, not fatal: a dir that cannot be read is skipped.
func FindUserRuntimeDirs(opts UserDirsOptions) ([]UserDir, []error) {
	opts, procRoot := opts.withDefaults()
	var problems []error
	accounts, err := readPasswd(opts.Passwd)
	if err != nil {
		problems = append(problems, err)
	}
	allowed, unknown := allowedUIDs(opts, accounts)
	problems = append(problems, unknown...)
	cands, err := processDirs(opts.Procs, procRoot, allowed)
	if err != nil {
		problems = append(problems, err)
	}
	cands = append(cands, homeDirs(accounts, allowed)...)
	out, notOwned := ownedDirs(cands)
	return out, append(problems, notOwned...)
}

// withDefaults is opts with its zero fields given their defaults, and the
// root of the process table they read.
func (opts UserDirsOptions) withDefaults() (UserDirsOptions, string) {
	if opts.Procs == nil {
		opts.Procs = &procs.FS{}
	}
	procRoot := opts.Procs.Root
	if procRoot == "" {
		procRoot = "/proc"
	}
	if opts.Passwd == "" {
		opts.Passwd = "/etc/passwd"
	}
	if opts.MinUID == 0 {
		opts.MinUID = 1000
	}
	return opts, procRoot
}

// allowedUIDs says which uids dirs are found for: the accounts named in
// opts.Users when given (each name no account has is a problem returned),
// else every uid from opts.MinUID up but nobody's (65534), which is no
// person's.
func allowedUIDs(opts UserDirsOptions, accounts []account) (allowed func(uint32) bool, problems []error) {
	if len(opts.Users) == 0 {
		return func(uid uint32) bool { return uid >= opts.MinUID && uid != 65534 }, nil
	}
	want := map[string]bool{}
	for _, u := range opts.Users {
		want[u] = true
	}
	uids := map[uint32]bool{}
	for _, a := range accounts {
		if want[a.name] {
			uids[a.uid] = true
			delete(want, a.name)
		}
	}
	for name := range want {
		problems = append(problems, fmt.Errorf("user %s: no such account in %s", name, opts.Passwd))
	}
	return func(uid uint32) bool { return uids[uid] }, problems
}

// processDirs finds the runtime dirs running processes of allowed users
// show, in pid order: the dir of a kernel's connection file (-f), and the
// runtime dir a Jupyter server computes from its environment. A process
// whose owner, cwd or environment cannot be read is passed over (gone, or
// not ours to read). An error reading the process table is returned as
// a problem, not fatal: the homes are still looked at.
func processDirs(fs *procs.FS, procRoot string, allowed func(uint32) bool) ([]UserDir, error) {
	cmdlines, listErr := fs.Cmdlines()
	pids := make([]int, 0, len(cmdlines))
	for pid := range cmdlines {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	var cands []UserDir
	for _, pid := range pids {
		argv := cmdlines[pid]
		file := connectionFileArg(argv)
		server := file == "" && isJupyterServer(argv)
		if file == "" && !server {
			continue
		}
		uid, ok := procUID(procRoot, pid)
		if !ok || !allowed(uid) {
			continue
		}
		if file != "" {
			if file, ok = fromCwd(procRoot, pid, file); ok {
				cands = append(cands, UserDir{Path: filepath.Dir(file), UID: uid, From: "kernel argv"})
			}
			continue
		}
		env, err := readEnviron(filepath.Join(procRoot, strconv.Itoa(pid), "environ"))
		if err != nil {
			continue // gone, or not ours to read
		}
		if dir := jupyterRuntimeDir(env); dir != "" {
			if dir, ok = fromCwd(procRoot, pid, dir); ok {
				cands = append(cands, UserDir{Path: dir, UID: uid, From: "server environment"})
			}
		}
	}
	return cands, listErr
}

// fromCwd is path as process pid means it: a relative path is from its
// working directory. ok is false when that cannot be read (gone, or not
// ours to read).
func fromCwd(procRoot string, pid int, path string) (string, bool) {
	if filepath.IsAbs(path) {
		return path, true
	}
	cwd, err := os.Readlink(filepath.Join(procRoot, strconv.Itoa(pid), "cwd"))
	if err != nil {
		return "", false
	}
	return filepath.Join(cwd, path), true
}

// homeDirs is ~/.local/share/jupyter/runtime of each allowed account with
// a home, found whether or not a kernel runs there: a user who logs in
// later is found as soon as that dir exists.
func homeDirs(accounts []account, allowed func(uint32) bool) []UserDir {
	var cands []UserDir
	for _, a := range accounts {
		if !allowed(a.uid) || a.home == "" || a.home == "/" {
			continue
		}
		cands = append(cands, UserDir{Path: filepath.Join(a.home, ".local", "share", "jupyter", "runtime"), UID: a.uid, From: "home"})
	}
	return cands
}

// ownedDirs keeps, of cands, each that is (its symlinks resolved) a
// directory owned by the user it was found for, once, sorted by path: a
// dir of someone else could hold files planted for that user, and is a
// problem returned. A dir not there (yet) is passed over.
func ownedDirs(cands []UserDir) ([]UserDir, []error) {
	var problems []error
	seen := map[string]bool{}
	var out []UserDir
	for _, c := range cands {
		dir, err := filepath.EvalSymlinks(c.Path)
		if err != nil {
			continue // not there (yet)
		}
		if seen[dir] {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(dir, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			continue
		}
		if st.Uid != c.UID {
			problems = append(problems, fmt.Errorf("runtime dir %s (%s of uid %d) belongs to uid %d: not watched; a user's runtime dir must be their own", dir, c.From, c.UID, st.Uid))
			continue
		}
		seen[dir] = true
		c.Path = dir
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, problems
}

// connectionFileArg returns the kernel-*.json a kernel's argv passes with
// -f (ipykernel_launcher, ipykernel, most kernels), or "".
func connectionFileArg(argv []string) string {
	for i, a := range argv {
		var f string
		switch {
		case (a == "-f" || a == "--f") && i+1 < len(argv):
			f = argv[i+1]
		case strings.HasPrefix(a, "-f="), strings.HasPrefix(a, "--f="):
			f = a[strings.IndexByte(a, '=')+1:]
		default:
			continue
		}
		if b := filepath.Base(f); strings.HasPrefix(b, "kernel-") && strings.HasSuffix(b, ".json") {
			return f
		}
	}
	return ""
}

// isJupyterServer says whether argv runs a Jupyter server: a script named
// like one, or python -m one of their modules.
func isJupyterServer(argv []string) bool {
	scripts := map[string]bool{"jupyterhub-singleuser": true, "jupyter-lab": true, "jupyter-labhub": true,
		"jupyter-server": true, "jupyter-notebook": true, "jupyter-nbclassic": true}
	modules := map[string]bool{"jupyterhub.singleuser": true, "jupyter_server": true, "jupyterlab": true,
		"notebook": true, "nbclassic": true}
	for i, a := range argv {
		if i > 2 {
			break // the interpreter, maybe -m, then the program
		}
		if scripts[filepath.Base(a)] {
			return true
		}
		if a == "-m" && i+1 < len(argv) && modules[argv[i+1]] {
			return true
		}
	}
	return false
}

// jupyterRuntimeDir is the runtime dir jupyter_core computes from env on
// Linux (jupyter_core.paths.jupyter_runtime_dir: platformdirs' data dir is
// the same XDG one there).
func jupyterRuntimeDir(env map[string]string) string {
	if d := env["JUPYTER_RUNTIME_DIR"]; d != "" {
		return d
	}
	if d := env["JUPYTER_DATA_DIR"]; d != "" {
		return filepath.Join(d, "runtime")
	}
	if d := env["XDG_DATA_HOME"]; d != "" {
		return filepath.Join(d, "jupyter", "runtime")
	}
	if h := env["HOME"]; h != "" {
		return filepath.Join(h, ".local", "share", "jupyter", "runtime")
	}
	return ""
}

// procUID is the owner of /proc/<pid>: the process's effective uid.
func procUID(procRoot string, pid int) (uint32, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(procRoot, strconv.Itoa(pid)), &st); err != nil {
		return 0, false
	}
	return st.Uid, true
}

// maxEnviron caps what is read of one process's environment.
const maxEnviron = 1 << 20

func readEnviron(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxEnviron))
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && k != "" {
			env[k] = v
		}
	}
	return env, nil
}

type account struct {
	name string
	uid  uint32
	home string
}

// readPasswd parses a passwd file (name:pw:uid:gid:gecos:home:shell);
// malformed lines are skipped.
func readPasswd(path string) ([]account, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	defer f.Close()
	var out []account
	sc := bufio.NewScanner(io.LimitReader(f, 64<<20))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < 7 {
			continue
		}
		uid, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			continue
		}
		out = append(out, account{name: fields[0], uid: uint32(uid), home: fields[5]})
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return out, fmt.Errorf("accounts %s: %w", path, err)
	}
	return out, nil
}
