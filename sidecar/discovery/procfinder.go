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

// PortOwners implements ProcessFinder.
func (f *ProcFinder) PortOwners(ports []int) (map[int]Owner, error) {
	out := map[int]Owner{}
	if len(ports) == 0 {
		return out, nil
	}
	listening, err := f.fs.ListeningTCPPorts()
	if err != nil {
		return out, err
	}
	var inodes []uint64
	portOf := map[uint64]int{}
	for _, p := range ports {
		if ino, ok := listening[p]; ok {
			inodes = append(inodes, ino)
			portOf[ino] = p
		}
	}
	if len(inodes) == 0 {
		return out, nil
	}
	owners, err := f.fs.SocketOwners(inodes)
	if err != nil {
		return out, err
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
		p, ok := table.Get(pid)
		if !ok {
			continue // exited since
		}
		out[portOf[ino]] = Owner{PID: pid, Start: p.StartTime}
	}
	return out, nil
}

// ArgvMentions implements ProcessFinder.
func (f *ProcFinder) ArgvMentions(names []string) (map[string][]Owner, error) {
	out := map[string][]Owner{}
	if len(names) == 0 {
		return out, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	table, err := f.fs.Scan()
	if err != nil {
		return out, err
	}
	for _, p := range table.All() {
		for i, arg := range p.Argv {
			flagged := i > 0 && (p.Argv[i-1] == "-f" || p.Argv[i-1] == "--f")
			// --f=FILE, -f=FILE, --connection-file=FILE
			if j := strings.IndexByte(arg, '='); j >= 0 && strings.HasPrefix(arg, "-") {
				flag := arg[:j]
				flagged = flag == "-f" || flag == "--f" || flag == "--connection-file"
				arg = arg[j+1:]
			}
			if base := filepath.Base(arg); want[base] {
				out[base] = append(out[base], Owner{PID: p.PID, Start: p.StartTime, Flagged: flagged})
				break
			}
		}
	}
	return out, nil
}
