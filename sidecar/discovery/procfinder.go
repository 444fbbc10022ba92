package discovery

import (
	"path/filepath"
	"strings"

	"github.com/gpumem/gpumem/sidecar/procs"
)

// ProcFinder is the ProcessFinder over a /proc tree.
type ProcFinder struct {
	fs *procs.FS
}

// NewProcFinder reads the /proc at root ("" = /proc).
func NewProcFinder(root string) *ProcFinder {
	return &ProcFinder{fs: &procs.FS{Root: root}}
}

// FindKernels implements ProcessFinder. It reads every process's argv once
// (one read each); the owner of a listening shell port is looked for first
// among the processes naming that kernel's file, and only when it is not
// there (a wrapper that passes the file otherwise) among all processes' fds.
func (f *ProcFinder) FindKernels(files []KernelFile) (map[string]Owner, error) {
	out := map[string]Owner{}
	if len(files) == 0 {
		return out, nil
	}
	cmdlines, err := f.fs.Cmdlines()
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
	fileOf := map[uint64]string{}
	var candidates []int
	for _, kf := range files {
		ino, ok := listening[kf.ShellPort]
		if kf.ShellPort == 0 || !ok {
			continue
		}
		inodes = append(inodes, ino)
		fileOf[ino] = kf.Name
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
	pids := make([]int, 0, len(owners))
	for _, pid := range owners {
		pids = append(pids, pid)
	}
	table, err := f.fs.ScanTree(pids)
	if err != nil {
		return out, err
	}
	for ino, pid := range owners {
		if p, ok := table.Get(pid); ok {
			out[fileOf[ino]] = Owner{PID: pid, Start: p.StartTime, FromPort: true}
		}
	}
	for _, kf := range files {
		if _, ok := out[kf.Name]; ok {
			continue
		}
		cands := mentions[kf.Name]
		for i := range cands {
			if p, ok := table.Get(cands[i].PID); ok {
				cands[i].Start = p.StartTime
			}
		}
		if o, ok := pickKernel(cands); ok {
			out[kf.Name] = o
		}
	}
	return out, firstErr
}

// argvMentions maps each file's name to the processes whose argv passes it
// as a kernel's connection file: "-f FILE", "--f=FILE", "--connection-file=FILE"
// (Flagged), or FILE alone, as IRkernel's; FILE equal to the name or ending in
// "/"+name.
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
				out[base] = append(out[base], Owner{PID: pid, Flagged: flagged})
				break
			}
		}
	}
	return out
}
