package discovery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Kernel is one kernel found from its connection file.
type Kernel struct {
	ID             string // from kernel-<id>.json
	ConnectionFile string
	Connection     protocol.ConnectionInfo
	Notebook       string // absolute path; "" when nothing names it
	ServerURL      string // "" without a server
	KernelName     string // kernelspec name, when known
	FileUID        uint32 // owner of the connection file
	FileID         procs.FileID
	PID            int    // 0 when no process could be found
	PIDStart       uint64 // start time (clock ticks since boot) of PID
	// PIDProven is true when PID is proven to serve this file (see
	// ProcFinder.FindKernels): only then may its process tree be counted or
	// acted on. Otherwise PID is a hint for listings, and Unproven says why.
	PIDProven bool
	// PIDUIDMatch is true when PID owns the shell port and runs as the
	// file's owner, but names the file nowhere: a reply signed with the
	// file's key can still prove it.
	PIDUIDMatch bool
	Unproven    string

	// Server is the server whose sessions list the kernel (ServerURL's);
	// the zero Server without one. ExecutionState and LastActivity are that
	// server's view of the kernel ("" and zero when unknown): what its own
	// idle culler judges by.
	Server         Server
	ExecutionState string
	LastActivity   time.Time

	// NotebookFrom says where Notebook came from: "server" (its
	// /api/sessions), "JPY_SESSION_NAME" (the kernel's environment, set by
	// jupyter_server 2 and VS Code; stale after a rename) or "papermill" (the
	// input notebook on its parent's command line).
	NotebookFrom string

	// Pod is where a kernel found inside a Kubernetes pod lives (see
	// PodFinder); nil for a kernel of this host's runtime dirs.
	Pod *PodKernel

	outside     bool   // found from a process's argv, not in a runtime dir
	sessionName string // JPY_SESSION_NAME of the proven process
	ppid        int    // parent of the proven process
}

// ProcessFinder resolves kernels' OS processes. The production
// implementation reads /proc (see ProcFinder).
type ProcessFinder interface {
	// FindKernels returns, by file path, the process serving each kernel:
	// the owner of its listening shell port (FromPort) or, failing that, the
	// process whose argv passes the file as a kernel's connection file.
	// Proven says whether it is proven to serve it. Files it cannot resolve
	// are left out.
	FindKernels(files []KernelFile) (map[string]Owner, error)
}

// ServerScoped is a ProcessFinder told which servers Discover found before
// it is asked anything (see NewScopedProcFinder).
type ServerScoped interface {
	SetServers(servers []Server)
}

// KernelFile is a connection file: its base name and path, the kernel's
// address and shell port (0 when the transport is not tcp), and the file's
// owner and identity.
type KernelFile struct {
	Name      string
	Path      string
	IP        string
	ShellPort int
	UID       uint32
	ID        procs.FileID
	// Unparsed is true for a file that does not parse: only a process
	// naming it can be found (brokenAdvice asks who still does).
	Unparsed bool
}

// Owner is a process identified by pid and start time.
type Owner struct {
	PID   int
	Start uint64
	// Flagged is true when the file came after -f (or as --f=FILE): a
	// kernel's launch line, not a frontend naming the file (jupyter
	// console --existing, a script).
	Flagged bool
	// FromPort is true when the process owns the kernel's listening shell
	// port on the file's address.
	FromPort bool
	// UIDMatch is true when it runs as the file's owner.
	UIDMatch bool
	// Proven is true when it owns the port, runs as the file's owner and
	// names the file: it is the kernel. Why says what is missing otherwise.
	Proven bool
	Why    string
	// Arg is the file's path as the process's argv wrote it.
	Arg string
	// SessionName is JPY_SESSION_NAME from its environment (readable by
	// its user or root), PPID its parent: they name the notebook of a
	// kernel that no server's session names.
	SessionName string
	PPID        int
}

// Options configures Discover.
type Options struct {
	RuntimeDirs []string
	HTTPClient  *http.Client // default: 5 s timeout
	Procs       ProcessFinder
	// ServerToken is sent to servers whose info file holds no token (a
	// password or external login, such as JupyterHub's): GPUMEM_SERVER_TOKEN,
	// but only to those whose URL one of ServerTokenURLs names
	// (GPUMEM_SERVER_TOKEN_URLS): a user's own server file could otherwise
	// claim it. Without ServerTokenURLs it is sent to none.
	ServerToken     string
	ServerTokenURLs []TokenPattern
	// ServerTimeout bounds each server's /api/sessions, body included
	// (0: defaultServerTimeout).
	ServerTimeout time.Duration
	// Backoff, kept from one Discover to the next, skips the servers that
	// failed until their delay is over (see ServerBackoff); nil: every
	// server is asked every time.
	Backoff *ServerBackoff
	// KernelFiles, kept from one Discover to the next, parses again only
	// the connection files that changed (see KernelFiles); nil: each anew.
	KernelFiles *KernelFiles
}

// defaultServerTimeout is how long a server has to list its sessions.
const defaultServerTimeout = 5 * time.Second

// Result is everything Discover found. Problems name the file or server and
// say what went wrong; they never stop discovery of the rest.
type Result struct {
	Kernels  []Kernel
	Servers  []Server
	Problems []error
	// Pending lists the ConnectionFiles of pod kernels that a live process
	// in the pod still names but that are not proven now (a kernel
	// restarting binds its ports a second after it starts): not gone.
	Pending []string
}

// Discover scans the runtime dirs, asks every server for its sessions, and
// resolves each kernel's process.
func Discover(ctx context.Context, opts Options) Result {
	var res Result
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: defaultServerTimeout}
	}
	if opts.ServerTimeout <= 0 {
		opts.ServerTimeout = defaultServerTimeout
	}
	seenFile := map[string]bool{}
	lf, _ := opts.Procs.(ListenerFinder)
	checker, _ := opts.Procs.(ProcessChecker)
	for _, dir := range opts.RuntimeDirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				res.Problems = append(res.Problems, fmt.Errorf("runtime dir %s: %w", dir, err))
			}
			continue
		}
		// Room for each entry at once: a scan lists a thousand kernels
		// every few seconds.
		res.Kernels = slices.Grow(res.Kernels, len(entries))
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasPrefix(name, "kernel-") || !strings.HasSuffix(name, ".json") {
				continue
			}
			file := filepath.Join(dir, name)
			if seenFile[file] {
				continue
			}
			seenFile[file] = true
			k, err := opts.KernelFiles.readSettled(ctx, file)
			if err != nil {
				if !errors.Is(err, errSettling) {
					res.Problems = append(res.Problems, brokenAdvice(err, opts.Procs))
				}
				continue
			}
			res.Kernels = append(res.Kernels, k)
		}
		files, err := serverFiles(dir)
		if err != nil {
			res.Problems = append(res.Problems, fmt.Errorf("runtime dir %s: %w", dir, err))
		}
		for _, f := range files {
			// The file's owner is whose server it may speak for, and a
			// file in a user's dir must be that user's (checkDirOwner).
			var st safefile.Info
			read := func(path string) ([]byte, error) {
				data, info, err := safefile.Read(path, maxServerFileBytes)
				if err == nil {
					err = checkDirOwner("server file", path, info)
				}
				st = info
				return data, err
			}
			s, err := readServerFile(ctx, f, read, serverFileReread)
			if err != nil {
				res.Problems = append(res.Problems, fileAdvice(err, serverFilePID(f), checker))
				continue
			}
			s.FileUID, s.listeners = st.UID, lf
			res.Servers = append(res.Servers, s)
		}
	}
	res.Servers = dedupeServers(res.Servers)
	if sc, ok := opts.Procs.(ServerScoped); ok {
		sc.SetServers(res.Servers)
	}
	if opts.ServerToken != "" && len(opts.ServerTokenURLs) == 0 {
		res.Problems = append(res.Problems, errors.New("GPUMEM_SERVER_TOKEN is set, but GPUMEM_SERVER_TOKEN_URLS names no server it is for: it is sent to none; list the URLs of the servers that accept it (a port may be *, as in http://127.0.0.1:*/user/)"))
	}
	for i := range res.Servers {
		s := &res.Servers[i]
		if s.Token == "" && opts.ServerToken != "" && tokenMeantFor(opts.ServerTokenURLs, s.URL) {
			s.Token, s.TokenGiven = opts.ServerToken, true
		}
	}
	// The servers answer (HTTP, from their Python) while /proc is read to
	// prove the kernels' processes and find kernels launched elsewhere: the
	// sessions fill what the servers say of each kernel, the proof what its
	// process is, never the same field, and the proof reads only the
	// connection files. The runtime dirs' kernels are proven before the
	// launched ones are looked for, which a scoped finder may make wait.
	answers := fetchSessions(ctx, hc, opts, res.Servers)
	var resolved []error
	if opts.Procs != nil {
		resolved = resolvePIDs(opts.Procs, res.Kernels)
	}
	if lister, ok := opts.Procs.(ConnectionFileLister); ok {
		n := len(res.Kernels)
		addLaunchedKernels(&res, lister, opts.RuntimeDirs, seenFile, opts.KernelFiles)
		if len(res.Kernels) > n {
			resolved = append(resolved, resolvePIDs(opts.Procs, res.Kernels[n:])...)
		}
	}
	res.Problems = append(res.Problems, applySessions(answers(), res.Kernels, checker)...)
	if opts.Procs != nil {
		res.Problems = append(res.Problems, resolved...)
		res.Kernels = dropUnprovenOutside(res.Kernels)
		nameNotebooks(opts.Procs, res.Kernels)
	}
	sort.Slice(res.Kernels, func(i, j int) bool {
		a, b := res.Kernels[i], res.Kernels[j]
		if a.Notebook != b.Notebook {
			return a.Notebook < b.Notebook
		}
		return a.ConnectionFile < b.ConnectionFile
	})
	return res
}

// maxServerFileBytes bounds a server file: real ones are about 500 bytes.
const maxServerFileBytes = 1 << 20

// serverFileReread is how long a server file that does not parse is left
// before it is read again: its server writes about 500 bytes at once.
const serverFileReread = 100 * time.Millisecond

// ReadKernelFile reads a kernel's connection file, with the identity and
// owner that proving its process needs. The kernel id is the name's
// kernel-<id>.json part, else the name without .json. A link in the file's
// place is not followed, and a file in a user's dir must be that user's
// (checkDirOwner).
func ReadKernelFile(path string) (Kernel, error) {
	return (*KernelFiles)(nil).read(path)
}

// kernelFile is the Kernel of a connection file read (info) from path.
func kernelFile(path string, info protocol.ConnectionInfo, st safefile.Info) Kernel {
	name := filepath.Base(path)
	return Kernel{
		ID:             strings.TrimSuffix(strings.TrimPrefix(name, "kernel-"), ".json"),
		ConnectionFile: path,
		Connection:     info,
		KernelName:     info.KernelName,
		FileUID:        st.UID,
		FileID:         procs.FileID{Dev: st.Dev, Ino: st.Ino},
	}
}

// KernelFileOf is what FindKernels needs of k.
func KernelFileOf(k Kernel) KernelFile {
	kf := KernelFile{Name: filepath.Base(k.ConnectionFile), Path: k.ConnectionFile, UID: k.FileUID, ID: k.FileID,
		IP: k.Connection.IP}
	if k.Connection.Transport == "tcp" {
		kf.ShellPort = k.Connection.ShellPort
	}
	return kf
}

// checkDirOwner refuses a file in a dir of one user that belongs to
// another: a hard link to someone else's connection file, or a file put
// there for its user to find. Read as root, such a file would hand its
// reader another user's key or sessions under the dir owner's name. A dir
// of root (/tmp, root's own runtime dir) may hold anyone's files: each
// kernel is still proven by its process, which runs as the file's owner.
func checkDirOwner(what, path string, st safefile.Info) error {
	if st.DirUID == 0 || st.UID == st.DirUID {
		return nil
	}
	return fmt.Errorf("%s %s belongs to uid %d, but its dir to uid %d: not read; a file in a user's dir counts only when it is that user's",
		what, path, st.UID, st.DirUID)
}

// dedupeServers drops servers listed twice (a runtime dir given twice through
// a link, or a stale file next to a live one with the same URL). Files of
// different owners are never one server: a file of another user naming the
// same URL must not hide the real one.
func dedupeServers(servers []Server) []Server {
	type key struct {
		url string
		uid uint32
	}
	seen := map[key]bool{}
	out := servers[:0]
	for _, s := range servers {
		k := key{s.URL, s.FileUID}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, s)
	}
	return out
}

// sessionsAnswer is what one server said of its sessions.
type sessionsAnswer struct {
	server   Server
	sessions []Session
	err      error
	skipped  bool
}

// fetchSessions asks every server (concurrently, each within
// opts.ServerTimeout, skipping those opts.Backoff holds back) for its
// sessions; the function it returns waits for the answers.
func fetchSessions(ctx context.Context, hc *http.Client, opts Options, servers []Server) func() []sessionsAnswer {
	answers := make([]sessionsAnswer, len(servers))
	files := make(map[string]bool, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		files[s.File] = true
		if !opts.Backoff.allow(s.File) {
			answers[i] = sessionsAnswer{server: s, skipped: true} // its failure was reported when it failed
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, opts.ServerTimeout)
			defer cancel()
			sessions, err := s.Sessions(sctx, hc)
			opts.Backoff.done(s.File, err != nil)
			answers[i] = sessionsAnswer{server: s, sessions: sessions, err: err}
		}()
	}
	return func() []sessionsAnswer {
		wg.Wait()
		opts.Backoff.keep(files)
		return answers
	}
}

// applySessions fills Notebook and ServerURL of the kernels the answers
// name. A server speaks only for the kernels of its own runtime dir (where
// jupyter_server writes both its file and its kernels' files) whose files
// belong to its file's owner: a session naming a kernel id is otherwise
// anyone's claim, and a kernel id is public (argv, /metrics). pc, when
// set, says whether a server that failed still runs (fileAdvice).
func applySessions(answers []sessionsAnswer, kernels []Kernel, pc ProcessChecker) []error {
	type ownKey struct {
		dir, id string
		uid     uint32
	}
	byID := map[ownKey]*Kernel{}
	for i := range kernels {
		k := &kernels[i]
		if !k.outside {
			byID[ownKey{filepath.Dir(k.ConnectionFile), k.ID, k.FileUID}] = k
		}
	}
	var problems []error
	for _, a := range answers {
		if a.skipped {
			continue
		}
		if a.err != nil {
			pid := a.server.PID
			if pid <= 0 {
				pid = serverFilePID(a.server.File)
			}
			problems = append(problems, fileAdvice(a.err, pid, pc))
			continue
		}
		for _, sess := range a.sessions {
			k := byID[ownKey{filepath.Dir(a.server.File), sess.Kernel.ID, a.server.FileUID}]
			if k == nil {
				continue
			}
			k.ServerURL = a.server.URL
			if sess.Kernel.Name != "" {
				k.KernelName = sess.Kernel.Name
			}
			k.Notebook = a.server.notebookPath(sess.Path)
			k.Server = a.server
			k.ExecutionState = sess.Kernel.ExecutionState
			k.LastActivity, _ = time.Parse(time.RFC3339Nano, sess.Kernel.LastActivity)
			k.NotebookFrom = "server"
		}
	}
	return problems
}

// resolvePIDs finds each kernel's process (see ProcFinder.FindKernels). A
// port owner that is not proven to be the kernel is reported as a problem.
func resolvePIDs(pf ProcessFinder, kernels []Kernel) []error {
	files := make([]KernelFile, 0, len(kernels))
	for _, k := range kernels {
		files = append(files, KernelFileOf(k))
	}
	owners, err := pf.FindKernels(files)
	var problems []error
	if err != nil {
		problems = append(problems, fmt.Errorf("finding kernel processes: %w", err))
	}
	for i := range kernels {
		k := &kernels[i]
		if o, ok := owners[k.ConnectionFile]; ok {
			k.PID, k.PIDStart = o.PID, o.Start
			k.PIDProven, k.PIDUIDMatch, k.Unproven = o.Proven, o.UIDMatch, o.Why
			if o.Proven {
				k.sessionName, k.ppid = o.SessionName, o.PPID
			}
			if !o.Proven && o.FromPort && !rewritten(*k) {
				problems = append(problems, fmt.Errorf("kernel connection file %s: not counted as a kernel: %s", k.ConnectionFile, o.Why))
			}
		}
	}
	return problems
}

// rewritten reports whether k's file is no longer the one read: a kernel
// restarting rewrites it (ipykernel deletes and writes it anew), and its
// process then names the new file, not the one judged. The next scan
// judges the new one.
func rewritten(k Kernel) bool {
	var st syscall.Stat_t
	if err := syscall.Lstat(k.ConnectionFile, &st); err != nil {
		return true
	}
	return procs.FileID{Dev: uint64(st.Dev), Ino: st.Ino} != k.FileID
}

// pickKernel chooses the kernel among processes naming its connection file.
// Processes passing it with -f are kernels (or launchers of one: the kernel
// is the last started); a file named bare is a kernel's only when no other
// process names it, since frontends (jupyter console --existing, scripts)
// name it bare too.
func pickKernel(cands []Owner) (Owner, bool) {
	var flagged []Owner
	for _, c := range cands {
		if c.Flagged {
			flagged = append(flagged, c)
		}
	}
	if len(flagged) == 0 {
		if len(cands) == 1 {
			return cands[0], true
		}
		return Owner{}, false
	}
	best := flagged[0]
	for _, c := range flagged[1:] {
		if c.Start > best.Start || (c.Start == best.Start && c.PID > best.PID) {
			best = c
		}
	}
	return best, true
}
