package procs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// ListeningTCPPorts returns, by port, the TCP sockets in LISTEN state in
// <root>/net/tcp and tcp6 (tcp's first): those of the network namespace of
// the process reading them (/proc/net is /proc/self/net). A missing tcp6
// (IPv6 disabled) is not an error.
func (fs *FS) ListeningTCPPorts() (map[int][]Listener, error) {
	return listeningTCPPorts(filepath.Join(fs.root(), "net"))
}

// ListeningTCPPortsOf is ListeningTCPPorts of the network namespace of
// process pid (<root>/<pid>/net): a pod's, whose sockets the daemon's own
// /proc/net does not list.
func (fs *FS) ListeningTCPPortsOf(pid int) (map[int][]Listener, error) {
	return listeningTCPPorts(filepath.Join(fs.root(), strconv.Itoa(pid), "net"))
}

func listeningTCPPorts(netDir string) (map[int][]Listener, error) {
	ports := make(map[int][]Listener)
	var errs []error
	read := 0
	for _, name := range []string{"tcp", "tcp6"} {
		path := filepath.Join(netDir, name)
		data, err := os.ReadFile(path)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		read++
		if err := parseNetTCP(data, ports); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
		}
	}
	if read == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("listening ports: neither %s nor tcp6 exists", filepath.Join(netDir, "tcp")))
	}
	if len(errs) > 0 {
		return ports, errors.Join(errs...)
	}
	return ports, nil
}

// SocketOwners returns inode → pid for the given socket inodes, by reading
// the /proc/<pid>/fd links ("socket:[N]"). Processes whose fds cannot be
// read (another user's, without root: EACCES) or that vanish are skipped, so
// an inode may be missing from the result. Where several processes share a
// socket (inherited fds), the lowest pid wins. Only an unreadable root is an
// error.
func (fs *FS) SocketOwners(inodes []uint64) (map[uint64]int, error) {
	if len(inodes) == 0 {
		return map[uint64]int{}, nil
	}
	pids, err := fs.pids()
	if err != nil {
		return nil, err
	}
	return fs.SocketOwnersAmong(inodes, pids), nil
}

// SocketOwnersAmong is SocketOwners looking only at the fds of pids: much
// cheaper when the caller knows the likely owners.
func (fs *FS) SocketOwnersAmong(inodes []uint64, pids []int) map[uint64]int {
	want := make(map[uint64]bool, len(inodes))
	for _, ino := range inodes {
		want[ino] = true
	}
	owners := make(map[uint64]int, len(inodes))
	if len(want) == 0 {
		return owners
	}
	for _, pid := range pids {
		fdDir := filepath.Join(fs.root(), strconv.Itoa(pid), "fd")
		dir, err := os.Open(fdDir)
		if err != nil {
			continue
		}
		names, err := dir.Readdirnames(-1)
		dir.Close()
		if err != nil {
			continue
		}
		for _, name := range names {
			link, err := os.Readlink(filepath.Join(fdDir, name))
			if err != nil {
				continue
			}
			ino, ok := parseSocketLink(link)
			if !ok || !want[ino] {
				continue
			}
			if old, seen := owners[ino]; !seen || pid < old {
				owners[ino] = pid
			}
		}
	}
	return owners
}
