package discovery

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// ProcFinder is the ProcessFinder over a /proc tree.
type ProcFinder struct {
	fs *procs.FS
	// scope, when set, is where this finder looks first (see
	// NewScopedProcFinder); nil: every process.
	scope *finderScope
}

// finderScope is a scoped finder's processes: the descendants of its
// servers, worked out on first use, and the pids extra gives, asked only
// when kernels launched elsewhere are looked for (extra may wait on NVML:
// the runtime dirs' kernels are proven without waiting).
type finderScope struct {
	servers []int
	below   sync.Once
	pids    []int // servers and their descendants, sorted

	extra     func() []int
	extraOnce sync.Once
	all       atomic.Pointer[[]int] // pids and extra's, once extra was asked
}

// NewScopedProcFinder is a ProcFinder for one answer about the processes
// that matter to it (one `gpumem ls`): argv is read only of the
// descendants of the servers Discover finds (SetServers: kernels are
// their children, or a launcher's) and, once kernels launched outside the
// runtime dirs are looked for (LaunchedConnectionFiles), of the pids extra
// returns (the GPU processes and their ancestors, say), not of every
// process on the host. Proof is as strict as ProcFinder's (port, owner,
// file named): only where a process looks changes. A file whose shell port
// someone outside that scope listens on is judged on every process, as
// ProcFinder judges it, so no kernel of the runtime dirs is missed;
// kernels launched outside them are found only within the scope. extra
// may block (on NVML's first sample); nil: none.
func NewScopedProcFinder(fs *procs.FS, extra func() []int) *ProcFinder {
	return &ProcFinder{fs: fs, scope: &finderScope{extra: extra}}
}

// SetServers implements ServerScoped: the servers whose descendants a
// scoped finder looks at. A server's pid is its file's claim; it only
// chooses where to look, never what is proven.
func (f *ProcFinder) SetServers(servers []Server) {
	if f.scope == nil {
		return
	}
	for _, s := range servers {
		if s.PID > 0 {
			f.scope.servers = append(f.scope.servers, s.PID)
		}
	}
}

// scopeDepth bounds the generations below a server that a scoped finder
// reads: the kernel (a child), a launcher's kernel (a grandchild), and
// their forked workers.
const scopeDepth = 4

// serverPIDs is the servers and their descendants, sorted, read once.
func (f *ProcFinder) serverPIDs() []int {
	sc := f.scope
	sc.below.Do(func() {
		seen := map[int]bool{}
		level := slices.Clone(sc.servers)
		for _, pid := range level {
			seen[pid] = true
		}
		sc.pids = slices.Clone(level)
		for depth := 0; depth < scopeDepth && len(level) > 0; depth++ {
			var next []int
			for _, pid := range level {
				kids, err := f.fs.ChildrenOf(pid)
				if err != nil {
					continue // gone: nothing below it to read
				}
				for _, k := range kids {
					if k > 0 && !seen[k] {
						seen[k] = true
						next = append(next, k)
					}
				}
			}
			sc.pids = append(sc.pids, next...)
			level = next
		}
		slices.Sort(sc.pids)
	})
	return sc.pids
}

// askExtra adds extra's pids to the scope, once.
func (f *ProcFinder) askExtra() {
	sc := f.scope
	sc.extraOnce.Do(func() {
		all := slices.Clone(f.serverPIDs())
		if sc.extra != nil {
			for _, pid := range sc.extra() {
				if pid > 0 {
					all = append(all, pid)
				}
			}
		}
		slices.Sort(all)
		all = slices.Compact(all)
		sc.all.Store(&all)
	})
}

// scopePIDs is where the scope looks now: the servers' descendants, and
// extra's pids once they have been asked.
func (f *ProcFinder) scopePIDs() []int {
	if all := f.scope.all.Load(); all != nil {
		return *all
	}
	return f.serverPIDs()
}

// cmdlines is the argv FindKernels and LaunchedConnectionFiles search: of
// the scope's processes, else of every process.
func (f *ProcFinder) cmdlines() (map[int][]string, error) {
	if f.scope != nil {
		return f.fs.CmdlinesOf(f.scopePIDs())
	}
	return f.fs.RecentCmdlines(argvMaxAge)
}

// NewProcFinder reads processes through fs.
func NewProcFinder(fs *procs.FS) *ProcFinder {
	return &ProcFinder{fs: fs}
}

// Alive implements ProcessChecker: pid exists in this /proc and is not a
// zombie.
func (f *ProcFinder) Alive(pid int) bool {
	root := f.fs.Root
	if root == "" {
		root = "/proc"
	}
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// FindKernels implements ProcessFinder. A connection file proves nothing by
// itself (it can be stale, its port now another program's, or planted by
// someone else), so a process is the kernel of a file only when all hold:
//   - it owns the listening socket on the port and address the file names;
//   - it runs as the user owning the file;
//   - its argv passes this very file (resolved as the process sees it) or it
//     holds the file open.
//
// A port owner that fails the last test only is returned unproven with
// UIDMatch set: a caller holding a client can still prove it by a reply
// signed with the file's key. It reads every process's argv once (one read
// each); fds are read only of the likely owners first, of all processes only
// when the owner is not among them. Results are keyed by the file's path:
// two users' files may share a base name (a kernel id is public), and
// several files may name one port (a file planted with another kernel's
// ports): each is judged on its own.
//
// A scoped finder (NewScopedProcFinder) judges first among its scope, then
// judges as an unscoped one the files whose shell port has a listener it
// did not find there.
func (f *ProcFinder) FindKernels(files []KernelFile) (map[string]Owner, error) {
	if f.scope == nil {
		out, _, err := f.findKernels(files)
		return out, err
	}
	out, unowned, err := f.findKernels(files)
	if err != nil || len(unowned) == 0 {
		return out, err
	}
	more, err := (&ProcFinder{fs: f.fs}).FindKernels(unowned)
	for path, o := range more {
		out[path] = o
	}
	return out, err
}

// findKernels is FindKernels over f.cmdlines(). A scoped finder looks for
// port owners among the processes naming the files only, and returns the
// files whose listener it found no owner of (unowned); an unscoped one
// then reads every process's fds.
func (f *ProcFinder) findKernels(files []KernelFile) (out map[string]Owner, unowned []KernelFile, err error) {
	out = map[string]Owner{}
	if len(files) == 0 {
		return out, nil, nil
	}
	cmdlines, err := f.cmdlines()
	if err != nil {
		return out, nil, err
	}
	mentions := argvMentions(cmdlines, files)
	var firstErr error
	listening, err := f.fs.ListeningTCPPorts()
	if err != nil {
		firstErr = err
	}
	var inodes []uint64
	filesOf := map[uint64][]KernelFile{}
	var candidates, details []int
	for _, kf := range files {
		for _, m := range mentions[kf.Name] {
			details = append(details, m.PID)
		}
		if kf.ShellPort == 0 {
			continue
		}
		ino, ok := listenerFor(listening[kf.ShellPort], kf.IP)
		if !ok {
			continue
		}
		if len(filesOf[ino]) == 0 {
			inodes = append(inodes, ino)
		}
		filesOf[ino] = append(filesOf[ino], kf)
		for _, o := range mentions[kf.Name] {
			candidates = append(candidates, o.PID)
		}
	}
	owners := f.fs.SocketOwnersAmong(inodes, candidates)
	if len(owners) < len(inodes) {
		var rest []uint64
		for _, ino := range inodes {
			if _, ok := owners[ino]; !ok {
				rest = append(rest, ino)
			}
		}
		if f.scope != nil {
			for _, ino := range rest {
				unowned = append(unowned, filesOf[ino]...)
			}
			rest = nil
		}
		more, err := f.fs.SocketOwners(rest)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		for ino, pid := range more {
			owners[ino] = pid
		}
	}
	for _, pid := range owners {
		details = append(details, pid)
	}
	table, err := f.fs.ReadProcs(details) // who they are, not their trees
	if err != nil {
		return out, nil, err
	}
	for ino, pid := range owners {
		p, ok := table.Get(pid)
		if !ok {
			continue
		}
		for _, kf := range filesOf[ino] {
			out[kf.Path] = f.judgePortOwner(p, kf, mentions[kf.Name])
		}
	}
	for _, kf := range files {
		if _, ok := out[kf.Path]; ok {
			continue
		}
		// No port owner (not listening yet, or ipc): the process that passes
		// the file with -f is reported, unproven, as a hint for listings.
		var cands []Owner
		for _, c := range mentions[kf.Name] {
			if p, ok := table.Get(c.PID); ok && p.Detailed && p.UID == kf.UID && f.fs.PathNames(c.PID, c.Arg, kf.ID, kf.Path) {
				c.Start = p.StartTime
				c.UIDMatch = true
				c.Why = "no process listens on the kernel's shell port"
				cands = append(cands, c)
			}
		}
		if o, ok := pickKernel(cands); ok {
			out[kf.Path] = o
		}
	}
	return out, unowned, firstErr
}

// argvMaxAge bounds how stale an argv read before may be (see
// procs.FS.RecentCmdlines): a scan reads the argv of new processes, and
// every process's once a minute, instead of every process's each time.
const argvMaxAge = time.Minute

// judgePortOwner is what process p, which owns kf's listening shell port,
// is to kf: proven only when it runs as the file's owner and names the file.
func (f *ProcFinder) judgePortOwner(p procs.Proc, kf KernelFile, mentions []Owner) Owner {
	o := Owner{PID: p.PID, Start: p.StartTime, FromPort: true, SessionName: p.SessionName, PPID: p.PPID}
	switch {
	case !p.Detailed:
		o.Why = fmt.Sprintf("port %d is served by pid %d, whose owner cannot be read", kf.ShellPort, p.PID)
	case p.UID != kf.UID:
		o.Why = fmt.Sprintf("port %d is served by pid %d (%s) of uid %d, but the file belongs to uid %d",
			kf.ShellPort, p.PID, argvOf(p), p.UID, kf.UID)
	default:
		o.UIDMatch = true
		if f.namesFile(p.PID, kf, mentions) {
			o.Proven = true
		} else {
			o.Why = fmt.Sprintf("port %d is served by pid %d (%s), which does not name this connection file",
				kf.ShellPort, p.PID, argvOf(p))
		}
	}
	return o
}

// namesFile reports whether pid passes kf in its argv (resolved as pid sees
// it) or holds it open.
func (f *ProcFinder) namesFile(pid int, kf KernelFile, mentions []Owner) bool {
	for _, m := range mentions {
		if m.PID == pid && f.fs.PathNames(pid, m.Arg, kf.ID, kf.Path) {
			return true
		}
	}
	return f.fs.HoldsOpen(pid, kf.ID)
}

// listenerFor picks the listening socket that serves connections to ip: one
// bound to ip itself, or to the wildcard address.
func listenerFor(ls []procs.Listener, ip string) (uint64, bool) {
	want := net.ParseIP(ip)
	switch ip {
	case "", "*":
		want = net.IPv4zero
	case "localhost":
		want = net.IPv4(127, 0, 0, 1)
	}
	if want == nil {
		return 0, false
	}
	l, ok := listenerAt(ls, want)
	return l.Inode, ok
}

// listenerAt is listenerFor of an address.
func listenerAt(ls []procs.Listener, want net.IP) (procs.Listener, bool) {
	for _, l := range ls {
		if l.IP.Equal(want) {
			return l, true
		}
	}
	for _, l := range ls {
		if l.IP.IsUnspecified() {
			return l, true
		}
	}
	return procs.Listener{}, false
}

func argvOf(p procs.Proc) string { return procs.CommandLine(p.Argv, p.Comm, 120) }

// argvMentions maps each file's name to the processes whose argv passes it
// as a kernel's connection file: "-f FILE", "--f=FILE", "--connection-file=FILE"
// (Flagged), or FILE alone, as IRkernel's; FILE equal to the name or ending in
// "/"+name. Arg keeps the path as written, for resolving it as the process
// sees it.
func argvMentions(cmdlines map[int][]string, files []KernelFile) map[string][]Owner {
	want := make(map[string]bool, len(files))
	for _, kf := range files {
		want[kf.Name] = true
	}
	out := map[string][]Owner{}
	for pid, argv := range cmdlines {
		for i, arg := range argv {
			if !strings.HasSuffix(arg, ".json") {
				continue
			}
			flagged := i > 0 && (argv[i-1] == "-f" || argv[i-1] == "--f")
			if j := strings.IndexByte(arg, '='); j >= 0 && strings.HasPrefix(arg, "-") {
				flag := arg[:j]
				flagged = flag == "-f" || flag == "--f" || flag == "--connection-file"
				arg = arg[j+1:]
			}
			if base := filepath.Base(arg); want[base] {
				out[base] = append(out[base], Owner{PID: pid, Flagged: flagged, Arg: arg})
				break
			}
		}
	}
	return out
}
