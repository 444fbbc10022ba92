package discovery

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// ProcFinder is the ProcessFinder over a /proc tree.
type ProcFinder struct {
	fs *procs.FS
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
func (f *ProcFinder) FindKernels(files []KernelFile) (map[string]Owner, error) {
	out := map[string]Owner{}
	if len(files) == 0 {
		return out, nil
	}
	cmdlines, err := f.fs.RecentCmdlines(argvMaxAge)
	if err != nil {
		return out, err
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
		return out, err
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
	return out, firstErr
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
