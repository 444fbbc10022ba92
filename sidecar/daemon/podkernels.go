package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"syscall"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/cgroups"
	"github.com/gpumem/gpumem/sidecar/discovery"
)

// PodKernelFinder finds the kernels inside this node's Kubernetes pods and
// reaches them where they live: their files through their process's root,
// their ports from inside their pod's network namespace.
// discovery.PodFinder is the implementation.
type PodKernelFinder interface {
	// Find lists the proven kernels of every pod, with their notebooks.
	Find(ctx context.Context) discovery.Result
	// ReadConnectionFile reads path as process (pid, start) resolves it.
	ReadConnectionFile(pid int, start uint64, path string) (protocol.ConnectionInfo, safefile.Info, error)
	// Dial connects from inside the network namespace of (pid, start).
	Dial(ctx context.Context, pid int, start uint64, network, addr string) (net.Conn, error)
}

// errNoKernelProcess: a pod kernel is reached through its process, and none
// is known now (it exited; a restarted one is proven at the next scan).
var errNoKernelProcess = errors.New("the kernel's process is not known now (restarting?): its pod is reached through it")

// podClientOptions are clientOptions for a kernel in a pod: the connection
// file is read through the root of the kernel's current process, and every
// socket is created inside that process's network namespace.
func (d *Daemon) podClientOptions(ks *kernelState) protocol.Options {
	opts := clientOptions
	current := func() procID {
		d.mu.Lock()
		defer d.mu.Unlock()
		return ks.cur
	}
	path := ks.pod.Path
	opts.ReadConnectionFile = func(string) (protocol.ConnectionInfo, error) {
		id := current()
		if id.isZero() {
			return protocol.ConnectionInfo{}, &protocol.ConnectionFileError{Path: ks.connFile, Err: errNoKernelProcess}
		}
		info, _, err := d.deps.PodKernels.ReadConnectionFile(id.PID, id.Start, path)
		return info, err
	}
	opts.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		id := current()
		if id.isZero() {
			return nil, fmt.Errorf("kernel %s: %w", ks.id, errNoKernelProcess)
		}
		return d.deps.PodKernels.Dial(ctx, id.PID, id.Start, network, addr)
	}
	return opts
}

// podFileExists reports whether a pod kernel's connection file is still
// there, looked at through the root of its witness (the kernel's server,
// in the same container): a kernel that died and is being restarted is
// named by no process for a few seconds, and only its server's deleting
// the file (or the container's end) is a shutdown. Called with d.mu held.
func (d *Daemon) podFileExists(ks *kernelState) bool {
	w := ks.podWitness
	if w.isZero() {
		return false
	}
	_, _, err := d.deps.PodKernels.ReadConnectionFile(w.PID, w.Start, ks.pod.Path)
	// A file being rewritten reads as invalid: it is there. A witness that
	// is gone (or whose pid was reused) says nothing.
	return err == nil || !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH)
}

// podOfProcess is the reclaim policy's pod rule: the pod UID of a process
// from its cgroup ("" outside any pod).
func (d *Daemon) podOfProcess(id procID) (string, error) {
	c, err := cgroups.ForProcess(d.deps.Cgroups, id.PID, id.Start)
	if err != nil {
		return "", err
	}
	return c.PodUID, nil
}
