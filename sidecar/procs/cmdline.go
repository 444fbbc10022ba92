package procs

import (
	"fmt"
	"strconv"
	"syscall"
)

// Cmdlines reads the argv of every process (one read each, nothing else):
// the cheap pass for finding which processes name a file. Processes that
// vanish or cannot be read are left out; only an unreadable root is an error.
func (fs *FS) Cmdlines() (map[int][]string, error) {
	pids, err := fs.pids()
	if err != nil {
		return nil, err
	}
	rootfd, err := syscall.Open(fs.root(), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read processes: %w", err)
	}
	defer syscall.Close(rootfd)
	out := make(map[int][]string, len(pids))
	buf := make([]byte, 0, 4096)
	for _, pid := range pids {
		data, err := readAt(rootfd, strconv.Itoa(pid)+"/cmdline", buf)
		if err != nil {
			continue
		}
		buf = data[:0]
		if argv := parseCmdline(data); len(argv) > 0 {
			out[pid] = argv
		}
	}
	return out, nil
}
