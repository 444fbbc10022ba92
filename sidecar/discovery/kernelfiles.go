package discovery

import (
	"bytes"
	"sync"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/protocol"
)

// KernelFiles remembers, by path, the connection files read: a file read
// again (as ReadKernelFile reads it: not through a link, a file of its
// dir's owner) whose bytes, owner and identity are the same as before is
// not parsed again. A daemon's scans read every kernel's file every few
// seconds, and parsing a thousand files was most of what a scan cost. The
// zero value is ready; safe for concurrent use; a nil *KernelFiles parses
// every file.
type KernelFiles struct {
	mu    sync.Mutex
	files map[string]readKernelFile
}

type readKernelFile struct {
	data   []byte
	st     safefile.Info
	kernel Kernel
}

// maxKernelFiles bounds what a KernelFiles remembers: the files of the
// runtime dirs are any user's to write.
const maxKernelFiles = 16384

func (c *KernelFiles) read(path string) (Kernel, error) {
	data, st, err := protocol.ReadConnectionFileBytes(path)
	if err == nil {
		err = checkDirOwner("kernel connection file", path, st)
	}
	if err != nil {
		return Kernel{}, err
	}
	if c != nil {
		c.mu.Lock()
		f, ok := c.files[path]
		c.mu.Unlock()
		if ok && f.st == st && bytes.Equal(f.data, data) {
			return f.kernel, nil
		}
	}
	info, err := protocol.ParseConnectionFile(data, path)
	if err != nil {
		return Kernel{}, err
	}
	k := kernelFile(path, info, st)
	if c != nil {
		c.mu.Lock()
		if c.files == nil || len(c.files) >= maxKernelFiles {
			c.files = map[string]readKernelFile{}
		}
		c.files[path] = readKernelFile{data: data, st: st, kernel: k}
		c.mu.Unlock()
	}
	return k, nil
}
