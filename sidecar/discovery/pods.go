package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpumem/gpumem/internal/netns"
	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/cgroups"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// Kernels inside Kubernetes pods, seen from a daemon that shares the host's
// pid namespace (hostPID): their connection files live in the pod's mount
// namespace and their ports in the pod's network namespace, neither of
// which the daemon's own paths and addresses reach. A pod kernel is found
// from its process: one whose cgroup is a pod's (package cgroups) and whose
// argv passes a connection file with -f. The file is read through the
// process's root, /proc/<pid>/root, resolved as the process resolves it
// (safefile.ReadInRoot): a symlink in the container never leads the daemon
// to a host file. The process is proven the kernel exactly as on the host
// (the port owner, of the file's owner, naming the file), with the listening
// sockets of its own network namespace (/proc/<pid>/net/tcp{,6}). The pod's
// Jupyter server is found from its jpserver-*.json beside the kernel's file
// and asked for its sessions from inside the pod's network namespace.

// PodKernel says where a kernel found in a pod lives.
type PodKernel struct {
	// UID is the pod's metadata.uid, ContainerID the runtime's id of the
	// container, from the kernel process's cgroup.
	UID         string
	ContainerID string
	// Path is the connection file's path inside the container.
	Path string
	// WitnessPID and WitnessStart identify the kernel's parent (its
	// Jupyter server) when it runs in the same container: through its
	// root the file can still be looked at while the kernel restarts and
	// no process names the file. Zero when there is none.
	WitnessPID   int
	WitnessStart uint64
}

// podKeyPrefix starts the ConnectionFile of a pod kernel: it names the
// file inside its pod and container, not a path of the daemon's.
const podKeyPrefix = "pod:"

// podKey is the ConnectionFile the daemon knows a pod kernel by.
func podKey(p PodKernel) string {
	c := p.ContainerID
	if len(c) > 12 {
		c = c[:12]
	}
	return podKeyPrefix + p.UID + "/" + c + ":" + p.Path
}

// PodFinder finds kernels inside Kubernetes pods through /proc (see above).
type PodFinder struct {
	fs *procs.FS
	// HTTPTimeout bounds a request to a pod's Jupyter server (default 5 s).
	HTTPTimeout time.Duration
}

// NewPodFinder reads processes through fs, which must be the host's /proc.
func NewPodFinder(fs *procs.FS) *PodFinder { return &PodFinder{fs: fs} }

// podCandidate is a process in a pod that passes a connection file with -f.
type podCandidate struct {
	proc   procs.Proc
	pod    PodKernel
	parent procs.Proc // zero when not in the same container
}

// Find returns the proven kernels of every pod on this node, each with its
// Pod and, when the pod's Jupyter server names it, its notebook. Problems
// name the pod, the process and the file.
func (f *PodFinder) Find(ctx context.Context) Result {
	var res Result
	cmdlines, err := f.fs.Cmdlines()
	if err != nil {
		res.Problems = append(res.Problems, fmt.Errorf("pod kernels: %w", err))
		return res
	}
	args := map[int]string{}
	var pids []int
	for pid, argv := range cmdlines {
		if arg := flaggedConnectionFile(argv); arg != "" {
			args[pid] = arg
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return res
	}
	sort.Ints(pids)
	table, err := f.fs.ScanTree(pids)
	if err != nil {
		res.Problems = append(res.Problems, fmt.Errorf("pod kernels: %w", err))
		return res
	}
	// Several processes may pass the same file (a launcher and its
	// kernel): one proven process per file, else one problem.
	byKey := map[string][]podCandidate{}
	var keys []string
	for _, pid := range pids {
		p, ok := table.Get(pid)
		if !ok || !p.Detailed {
			continue
		}
		c, err := cgroups.ForProcess(f.fs, pid, p.StartTime)
		if err != nil || !c.InPod() {
			continue // gone, or not in a pod: the runtime dirs' business
		}
		pk := PodKernel{UID: c.PodUID, ContainerID: c.ContainerID, Path: args[pid]}
		key := podKey(pk)
		if _, seen := byKey[key]; !seen {
			keys = append(keys, key)
		}
		var parent procs.Proc
		if pp, ok := table.Get(p.PPID); ok {
			if pc, err := cgroups.ForProcess(f.fs, pp.PID, pp.StartTime); err == nil && pc == c {
				parent = pp
			}
		}
		byKey[key] = append(byKey[key], podCandidate{proc: p, pod: pk, parent: parent})
	}
	for _, key := range keys {
		var whys []string
		found, starting := false, false
		for _, c := range byKey[key] {
			k, err := f.prove(c)
			if err != nil {
				starting = starting || errors.Is(err, errNotListening)
				whys = append(whys, err.Error())
				continue
			}
			res.Kernels = append(res.Kernels, k)
			found = true
			break
		}
		if found {
			continue
		}
		res.Pending = append(res.Pending, key)
		// A kernel starting (or restarting) binds its ports a second after
		// it is launched: not worth a warning, as on the host.
		if !starting {
			res.Problems = append(res.Problems, fmt.Errorf("pod %s: connection file %s: not counted as a kernel: %s",
				byKey[key][0].pod.UID, byKey[key][0].pod.Path, strings.Join(whys, "; ")))
		}
	}
	res.Problems = append(res.Problems, f.nameNotebooks(ctx, &res)...)
	return res
}

// errNotListening: nothing listens on the kernel's shell port in its
// network namespace (yet).
var errNotListening = errors.New("nothing listens")

// maxPodFileBytes bounds a connection or server file read from a pod.
const maxPodFileBytes = 1 << 20

// prove reads the candidate's connection file through its root and proves
// it the kernel: it owns the listening shell port in its own network
// namespace, runs as the file's owner, and names the file (it passes this
// path, read as it resolves it).
func (f *PodFinder) prove(c podCandidate) (Kernel, error) {
	p := c.proc
	if !filepath.IsAbs(c.pod.Path) {
		return Kernel{}, fmt.Errorf("pid %d passes the relative path %s: only absolute connection file paths are read in pods", p.PID, c.pod.Path)
	}
	info, st, err := f.ReadConnectionFile(p.PID, p.StartTime, c.pod.Path)
	if err != nil {
		return Kernel{}, fmt.Errorf("pid %d: %w", p.PID, err)
	}
	if st.UID != p.UID {
		return Kernel{}, fmt.Errorf("pid %d runs as uid %d, but the file belongs to uid %d", p.PID, p.UID, st.UID)
	}
	if info.Transport != "tcp" {
		return Kernel{}, fmt.Errorf("pid %d: transport %q: only tcp kernels are attached in pods", p.PID, info.Transport)
	}
	listening, err := f.fs.ListeningTCPPortsOf(p.PID)
	if err != nil {
		return Kernel{}, fmt.Errorf("pid %d: listening ports of its network namespace: %w", p.PID, err)
	}
	ino, ok := listenerFor(listening[info.ShellPort], info.IP)
	if !ok {
		return Kernel{}, fmt.Errorf("%w on shell port %d in the network namespace of pid %d", errNotListening, info.ShellPort, p.PID)
	}
	if owner, ok := f.fs.SocketOwnersAmong([]uint64{ino}, []int{p.PID})[ino]; !ok || owner != p.PID {
		return Kernel{}, fmt.Errorf("shell port %d in its network namespace is not served by pid %d", info.ShellPort, p.PID)
	}
	// All of the above read /proc/<pid> by number: the process must still
	// be the one whose start time was read, or the pid was reused meanwhile.
	fd, err := f.fs.OpenPID(p.PID, p.StartTime)
	if err != nil {
		return Kernel{}, err
	}
	unix.Close(fd)
	name := filepath.Base(c.pod.Path)
	return Kernel{
		ID:             strings.TrimSuffix(strings.TrimPrefix(name, "kernel-"), ".json"),
		ConnectionFile: podKey(c.pod),
		Connection:     info,
		KernelName:     info.KernelName,
		FileUID:        st.UID,
		FileID:         procs.FileID{Dev: st.Dev, Ino: st.Ino},
		PID:            p.PID,
		PIDStart:       p.StartTime,
		PIDProven:      true,
		PIDUIDMatch:    true,
		Pod: &PodKernel{UID: c.pod.UID, ContainerID: c.pod.ContainerID, Path: c.pod.Path,
			WitnessPID: c.parent.PID, WitnessStart: c.parent.StartTime},
		sessionName: p.SessionName,
		ppid:        p.PPID,
	}, nil
}

// openIn opens name (a magic link such as "root" or "ns/net") of process
// (pid, start) with flags.
func (f *PodFinder) openIn(pid int, start uint64, name string, flags int) (int, error) {
	dirfd, err := f.fs.OpenPID(pid, start)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dirfd)
	fd, err := unix.Openat(dirfd, name, flags|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return -1, fmt.Errorf("pid %d: open %s: %w (another user's process: the daemon needs CAP_SYS_PTRACE)", pid, name, err)
	}
	if err != nil {
		return -1, fmt.Errorf("pid %d: open %s: %w", pid, name, err)
	}
	return fd, nil
}

// rootName names process pid's root in errors.
func rootName(pid int) string { return "/proc/" + strconv.Itoa(pid) + "/root" }

// ReadConnectionFile reads and validates the connection file at path as
// process (pid, start) sees it: resolved inside its root. An error wraps
// fs.ErrNotExist when the file is not there, syscall.ESRCH when the
// process is gone.
func (f *PodFinder) ReadConnectionFile(pid int, start uint64, path string) (protocol.ConnectionInfo, safefile.Info, error) {
	name := filepath.Join(rootName(pid), path)
	rootFD, err := f.openIn(pid, start, "root", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return protocol.ConnectionInfo{}, safefile.Info{}, &protocol.ConnectionFileError{Path: name, Err: err}
	}
	defer unix.Close(rootFD)
	data, st, err := safefile.ReadInRoot(rootFD, rootName(pid), path, maxPodFileBytes)
	if errors.Is(err, unix.EACCES) {
		err = fmt.Errorf("%w (another user's file: the daemon needs CAP_DAC_READ_SEARCH)", err)
	}
	if err != nil {
		return protocol.ConnectionInfo{}, st, &protocol.ConnectionFileError{Path: name, Err: err}
	}
	info, err := protocol.ParseConnectionInfo(data)
	if err != nil {
		var cfe *protocol.ConnectionFileError
		if errors.As(err, &cfe) {
			cfe.Path = name
		}
		return protocol.ConnectionInfo{}, st, err
	}
	info.Path = name
	return info, st, nil
}

// Dial connects to addr from inside the network namespace of process
// (pid, start). A host name is dialed on the pod's loopback (127.0.0.1):
// the daemon's resolver does not know the pod's names, and a pod's Jupyter
// server names itself by its host name while listening on every address.
func (f *PodFinder) Dial(ctx context.Context, pid int, start uint64, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && net.ParseIP(host) == nil {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	nsFD, err := f.openIn(pid, start, "ns/net", unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(nsFD)
	return netns.DialFD(ctx, nsFD, network, addr)
}

// httpClient is the client options of requests to a pod's servers: its
// deadline (Server.requestTarget dials through the server's podNet).
func (f *PodFinder) httpClient() *http.Client {
	timeout := f.HTTPTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return &http.Client{Timeout: timeout}
}

// podNet is the network namespace of a pod, seen through process (pid,
// start): who listens there, and dialing from inside it.
type podNet struct {
	f     *PodFinder
	pid   int
	start uint64
}

// TCPListener implements ListenerFinder in the pod's network namespace.
func (n *podNet) TCPListener(ip net.IP, port int) (procs.Listener, bool, error) {
	listening, err := n.f.fs.ListeningTCPPortsOf(n.pid)
	if err != nil && len(listening) == 0 {
		return procs.Listener{}, false, err
	}
	l, ok := listenerAt(listening[port], ip)
	return l, ok, nil
}

func (n *podNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.f.Dial(ctx, n.pid, n.start, network, addr)
}

// nameNotebooks finds the Jupyter servers beside each pod kernel's file
// (jpserver-*.json in the same dir, of the same owner) and names each
// kernel's notebook from their sessions; a kernel no server names falls
// back to its JPY_SESSION_NAME.
func (f *PodFinder) nameNotebooks(ctx context.Context, res *Result) []error {
	type dirKey struct {
		pod, container, dir string
		uid                 uint32
	}
	var problems []error
	done := map[dirKey]bool{}
	for i := range res.Kernels {
		k := &res.Kernels[i]
		dk := dirKey{k.Pod.UID, k.Pod.ContainerID, filepath.Dir(k.Pod.Path), k.FileUID}
		if done[dk] {
			continue
		}
		done[dk] = true
		servers, errs := f.podServers(k.PID, k.PIDStart, dk.dir, dk.uid)
		problems = append(problems, errs...)
		hc := f.httpClient()
		for _, s := range servers {
			if strings.HasPrefix(s.URL, "http+unix://") {
				problems = append(problems, fmt.Errorf("pod %s: server %s listens on a unix socket, which is not asked in pods", k.Pod.UID, s.File))
				continue
			}
			sessions, err := s.Sessions(ctx, hc)
			if err != nil {
				problems = append(problems, fmt.Errorf("pod %s: %w", k.Pod.UID, err))
				continue
			}
			for _, sess := range sessions {
				for j := range res.Kernels {
					o := &res.Kernels[j]
					if o.Pod.UID != k.Pod.UID || o.Pod.ContainerID != k.Pod.ContainerID || o.ID != sess.Kernel.ID ||
						filepath.Dir(o.Pod.Path) != dk.dir {
						continue
					}
					o.ServerURL = s.URL
					if sess.Kernel.Name != "" {
						o.KernelName = sess.Kernel.Name
					}
					o.Notebook = s.notebookPath(sess.Path)
					o.NotebookFrom = "server"
					o.ExecutionState = sess.Kernel.ExecutionState
					o.LastActivity, _ = time.Parse(time.RFC3339Nano, sess.Kernel.LastActivity)
				}
			}
		}
	}
	for i := range res.Kernels {
		k := &res.Kernels[i]
		if k.Notebook == "" && filepath.IsAbs(k.sessionName) {
			k.Notebook, k.NotebookFrom = k.sessionName, "JPY_SESSION_NAME"
		}
	}
	return problems
}

// podServers reads the server files in dir inside the root of process
// (pid, start) that belong to uid: a file of another user in the dir could
// name a notebook falsely.
func (f *PodFinder) podServers(pid int, start uint64, dir string, uid uint32) ([]Server, []error) {
	rootFD, err := f.openIn(pid, start, "root", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return nil, []error{err}
	}
	defer unix.Close(rootFD)
	names, err := safefile.ListInRoot(rootFD, rootName(pid), dir)
	if err != nil {
		return nil, []error{err}
	}
	sort.Strings(names)
	var servers []Server
	var problems []error
	for _, n := range names {
		if !strings.HasPrefix(n, "jpserver-") && !strings.HasPrefix(n, "nbserver-") || !strings.HasSuffix(n, ".json") {
			continue
		}
		path := filepath.Join(dir, n)
		data, st, err := safefile.ReadInRoot(rootFD, rootName(pid), path, maxServerFileBytes)
		if err != nil {
			if !errors.Is(err, syscall.ENOENT) {
				problems = append(problems, fmt.Errorf("server file: %w", err))
			}
			continue
		}
		if st.UID != uid {
			problems = append(problems, fmt.Errorf("server file %s belongs to uid %d, the kernel's file to uid %d: not asked",
				filepath.Join(rootName(pid), path), st.UID, uid))
			continue
		}
		s, err := parseServerFile(filepath.Join(rootName(pid), path), data)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		s.FileUID, s.netns = st.UID, &podNet{f: f, pid: pid, start: start}
		servers = append(servers, s)
	}
	return dedupeServers(servers), problems
}
