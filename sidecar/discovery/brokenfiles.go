package discovery

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpumem/gpumem/internal/safefile"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// A connection file that does not parse is most often one being written:
// jupyter_client writes it in place before it starts the kernel, and
// ipykernel deletes and rewrites it at start-up (and at each restart), so
// a scan at that moment reads it empty or cut short. Such a file counts as
// broken only when it stays so, with the same bytes, over brokenSettle and
// at least two scans; it is then told once per file and content, and the
// advice to restart the kernel is given only when a live kernel of the
// file's owner names it.

// brokenSettle is how long a connection file must stay unparsable, with
// the same bytes, before it counts as broken: ipykernel rewrites its file
// within a second of starting.
const brokenSettle = 2 * time.Second

// kernelFileReread is how long Discover without a KernelFiles (a one-shot
// listing) waits before it reads an unparsable file once more.
const kernelFileReread = 100 * time.Millisecond

// brokenFile is what KernelFiles remembers of a file that did not parse.
type brokenFile struct {
	sum   [sha256.Size]byte
	st    safefile.Info
	since time.Time
	scans int
	told  bool
}

// errSettling is read's answer for an unparsable file that has not
// stayed so long enough, or that was told already: no problem to report.
var errSettling = errors.New("connection file not settled, or told already")

// settledError is an unparsable connection file that stayed so.
type settledError struct {
	path  string
	st    safefile.Info
	err   error
	stale time.Duration // how long it stayed so (0: not measured)
	msg   string        // the problem with its advice (brokenAdvice); "": err's
}

func (e *settledError) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return e.err.Error()
}
func (e *settledError) Unwrap() error { return e.err }

// maxBrokenFiles bounds what a KernelFiles remembers of broken files: the
// runtime dirs are any user's to write.
const maxBrokenFiles = 4096

// settle records that path read as data (st) did not parse (err) and
// says what to report: errSettling while it may still be being written,
// a *settledError once, the first time it has stayed so.
func (c *KernelFiles) settle(path string, data []byte, st safefile.Info, err error, now time.Time) error {
	sum := sha256.Sum256(data)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil || len(c.broken) >= maxBrokenFiles {
		c.broken = map[string]*brokenFile{}
	}
	b, ok := c.broken[path]
	if !ok || b.sum != sum || b.st != st {
		c.broken[path] = &brokenFile{sum: sum, st: st, since: now, scans: 1}
		return errSettling
	}
	b.scans++
	if b.told || b.scans < 2 || now.Sub(b.since) < brokenSettle {
		return errSettling
	}
	b.told = true
	return &settledError{path: path, st: st, err: err, stale: now.Sub(b.since).Round(time.Second)}
}

// parsed forgets that path was broken: it parses now, or is gone.
func (c *KernelFiles) parsed(path string) {
	c.mu.Lock()
	delete(c.broken, path)
	c.mu.Unlock()
}

// readSettled is read for Discover: without a KernelFiles to remember the
// file by, an unparsable file is read once more a moment later.
func (c *KernelFiles) readSettled(ctx context.Context, path string) (Kernel, error) {
	k, err := c.read(path)
	if c != nil {
		return k, err
	}
	var se *settledError
	if !errors.As(err, &se) {
		return k, err
	}
	select {
	case <-ctx.Done():
		return k, err
	case <-time.After(kernelFileReread):
	}
	return c.read(path)
}

// restartHint ends protocol's words for a file that does not parse; it is
// kept only when a live kernel names the file.
const restartHint = "; restart the kernel to rewrite it"

// brokenAdvice ends the problem of a connection file that stayed
// unparsable: restart its kernel when a live process of the file's owner
// names it (its kernel, which would rewrite it); otherwise it is left over
// from a kernel that is gone, or not a kernel's at all.
func brokenAdvice(err error, pf ProcessFinder) error {
	var se *settledError
	if !errors.As(err, &se) {
		return err
	}
	msg, damaged := strings.CutSuffix(se.err.Error(), restartHint)
	if !damaged {
		return se.err // not a matter of a rewrite (a CURVE key, a transport)
	}
	if se.stale > 0 {
		msg += fmt.Sprintf(" (it stayed so for %s)", se.stale)
	}
	out := *se
	if pid := namingKernel(pf, se); pid > 0 {
		out.msg = fmt.Sprintf("%s; its kernel (pid %d) is running: restart the kernel to rewrite it", msg, pid)
	} else {
		out.msg = msg + "; no running kernel names it: delete it if no kernel is starting with it"
	}
	return &out
}

// namingKernel is the pid of a live process of the file's owner that
// passes the file as its connection file, or 0.
func namingKernel(pf ProcessFinder, se *settledError) int {
	if pf == nil {
		return 0
	}
	kf := KernelFile{Name: filepath.Base(se.path), Path: se.path, UID: se.st.UID,
		ID: procs.FileID{Dev: se.st.Dev, Ino: se.st.Ino}, Unparsed: true}
	owners, _ := pf.FindKernels([]KernelFile{kf})
	if o, ok := owners[se.path]; ok && o.UIDMatch && o.Flagged {
		return o.PID
	}
	return 0
}
