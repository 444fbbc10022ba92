package discovery

import (
	"bytes"
	"errors"
	"io/fs"
	"sync"
	"time"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/protocol"
)

// KernelFiles remembers, by path, the connection files read: a file read
// again (as ReadKernelFile reads it: not through a link, a file of its
// dir's owner) whose bytes, owner and identity are the same as before is
// not parsed again, and one whose stamp (identity, owner, size, times: a
// stat of it and of its dir) is unchanged is not even read, but for once
// every rereadEvery. A daemon's scans read every kernel's file every few
// seconds, and parsing, then reading, a thousand files was most of what a
// scan cost. The zero value is ready; safe for concurrent use; a nil
// *KernelFiles reads and parses every file.
type KernelFiles struct {
	mu     sync.Mutex
	files  map[string]readKernelFile
	broken map[string]*brokenFile // files that did not parse (see settle)
}

type readKernelFile struct {
	data   []byte
	st     safefile.Info
	stamp  safefile.Stamp
	readAt time.Time
	kernel Kernel
}

// maxKernelFiles bounds what a KernelFiles remembers: the files of the
// runtime dirs are any user's to write.
const maxKernelFiles = 16384

// rereadEvery is how often a remembered file is read again although its
// stamp says it is unchanged: a network mount's server stamps changes
// with its own clock, which may lag ours by more than the stamp's margin.
const rereadEvery = time.Minute

func (c *KernelFiles) read(path string) (Kernel, error) {
	now := time.Now()
	if k, ok := c.unchanged(path, now); ok {
		return k, nil
	}
	data, st, stamp, err := protocol.ReadConnectionFileBytes(path)
	if err == nil {
		err = checkDirOwner("kernel connection file", path, st)
	}
	if err != nil {
		if c != nil && errors.Is(err, fs.ErrNotExist) {
			c.parsed(path)
		}
		return Kernel{}, err
	}
	if c != nil {
		c.mu.Lock()
		f, ok := c.files[path]
		hit := ok && f.st == st && bytes.Equal(f.data, data)
		if hit {
			// Parsable again (jupyter_client rewrites in place): a later
			// empty read is a new write, not the old one lasting.
			delete(c.broken, path)
			f.stamp, f.readAt = stamp, now
			c.files[path] = f
		}
		c.mu.Unlock()
		if hit {
			return f.kernel, nil
		}
	}
	info, err := protocol.ParseConnectionFile(data, path)
	if err != nil {
		if c == nil {
			return Kernel{}, &settledError{path: path, st: st, err: err}
		}
		return Kernel{}, c.settle(path, data, st, err, now)
	}
	k := kernelFile(path, info, st)
	if c != nil {
		c.mu.Lock()
		delete(c.broken, path)
		if c.files == nil || len(c.files) >= maxKernelFiles {
			c.files = map[string]readKernelFile{}
		}
		c.files[path] = readKernelFile{data: data, st: st, stamp: stamp, readAt: now, kernel: k}
		c.mu.Unlock()
	}
	return k, nil
}

// unchanged answers for path from memory when its stamp says the file is
// the one parsed last, read under rereadEvery ago. Only a file that parsed
// is remembered: one broken since has another stamp.
func (c *KernelFiles) unchanged(path string, now time.Time) (Kernel, bool) {
	if c == nil {
		return Kernel{}, false
	}
	c.mu.Lock()
	f, ok := c.files[path]
	c.mu.Unlock()
	if !ok || now.Sub(f.readAt) >= rereadEvery || !f.stamp.Unchanged(path) {
		return Kernel{}, false
	}
	c.parsed(path)
	return f.kernel, true
}
