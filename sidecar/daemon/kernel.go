package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/discovery"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// recordedProc is what we remember of a process seen in a kernel's tree.
type recordedProc struct {
	UID  uint32
	Argv string
}

// kernelState is one kernel (one connection file) over its life: several
// kernel processes when it restarts. Fields after mu-comment are guarded by
// Daemon.mu.
type kernelState struct {
	id       string
	connFile string
	cancel   context.CancelFunc

	// guarded by Daemon.mu
	notebook  string
	serverURL string
	cur       procID // the kernel process now; zero while unknown
	uid       uint32 // owner of cur
	recorded  map[procID]recordedProc
	// observedIn and observedFor are the table the last observe that found
	// the kernel alive read, and the kernel process it read it for: a
	// Table does not change once built (the tracker hands out the same one
	// while nothing in any tree changed), so observing it again for the
	// same process would change nothing. Cleared wherever recorded is
	// replaced.
	observedIn  *procs.Table
	observedFor procID
	client      *protocol.Client
	// missingSince is when a scan first found the connection file missing.
	missingSince time.Time
	// fileGone is true once the file is gone for good while the kernel
	// process lives on: detached, its tree still protected.
	fileGone bool
	// fileUID and fileID are the connection file's owner and identity,
	// which the kernel process must match (discovery.KernelFile).
	fileUID uint32
	fileID  procs.FileID
	// proving is true while a kernel_info request checks that an unproven
	// port owner holds the file's key.
	proving bool
	// server, execState and lastActivity are the kernel's server's view of
	// it at the last scan that could ask (zero without a server).
	server       discovery.Server
	execState    string
	lastActivity time.Time
	cull         cullState
	// childrenBefore is the tree's figures ChildrenBefore read at
	// childrenBeforeAt, for the free --children the kernel asks next.
	childrenBefore   attribution.Notebook
	childrenBeforeAt time.Time
	// injectSince is when an injection still waiting for its reply was
	// sent (zero when none): a kernel that does not answer it for long is
	// running a cell, even one started before the daemon attached.
	injectSince time.Time
	// launched is true for a kernel found from a process's argv, its file
	// outside the runtime dirs: it is followed while a process names the
	// file. Fixed at creation.
	launched bool
	// pod is where a kernel found inside a Kubernetes pod lives; nil for
	// a kernel of this host's runtime dirs. Fixed at creation.
	pod *discovery.PodKernel
	// podWitness is a process in the pod kernel's container (its server)
	// through whose root its file is looked at while no kernel process
	// names it; zero when none.
	podWitness procID
}

// shellBusy reports whether the kernel runs a cell, as far as the daemon
// can tell by itself: its client saw a cell's busy status on iopub, or an
// injection has waited for its reply behind one. Called with Daemon.mu held.
func (ks *kernelState) shellBusy(now time.Time) bool {
	if ks.client != nil && ks.client.ExecutionState() == "busy" {
		return true
	}
	return !ks.injectSince.IsZero() && now.Sub(ks.injectSince) > 2*time.Second
}

func newKernelState(k discovery.Kernel) *kernelState {
	return &kernelState{id: k.ID, connFile: k.ConnectionFile, notebook: k.Notebook,
		serverURL: k.ServerURL, recorded: map[procID]recordedProc{}, fileUID: k.FileUID, fileID: k.FileID, pod: k.Pod}
}

func (p procID) isZero() bool { return p.PID == 0 }

// observe records the live kernel process's tree in table and forgets
// recorded processes that have exited (a kernel that starts workers every
// epoch must not grow the set without bound); a recorded process that left
// the tree but lives on (setsid, reparented) stays recorded. It reports
// false, changing nothing, when the kernel process itself is gone from
// table or a zombie (exited, its parent has not reaped it). Called with
// Daemon.mu held.
func (ks *kernelState) observe(table *procs.Table) bool {
	if table != nil && table == ks.observedIn && ks.cur == ks.observedFor {
		return true // read already, and a Table does not change
	}
	kp, alive := table.Lookup(ks.cur.PID, ks.cur.Start)
	if !alive || kp.Exited() {
		return false
	}
	if kp.Detailed {
		ks.uid = kp.UID
	}
	for id := range ks.recorded {
		if _, ok := table.Lookup(id.PID, id.Start); !ok {
			delete(ks.recorded, id)
		}
	}
	for _, p := range table.KernelProcesses(ks.cur.PID, ks.cur.Start) {
		id := procID{p.PID, p.StartTime}
		if id == ks.cur {
			continue
		}
		rec := ks.recorded[id]
		if p.Detailed {
			rec = recordedProc{UID: p.UID, Argv: procs.CommandLine(p.Argv, p.Comm, 200)}
		}
		ks.recorded[id] = rec
	}
	ks.observedIn, ks.observedFor = table, ks.cur
	return true
}

// takeRecordedLocked hands over the recorded set and starts a new one.
func (ks *kernelState) takeRecordedLocked() map[procID]recordedProc {
	r := ks.recorded
	ks.recorded = map[procID]recordedProc{}
	ks.observedIn = nil
	return r
}

// Attach timing: a kernel is followed once a process of its file's owner
// serves or names it, so it listens already or within a second or so (it
// binds its ports after its file appears): attach is retried from
// attachRetry, the delay doubling from the first failure up to
// attachMaxBackoff, so that a kernel that never answers costs a dial every
// few seconds, not ten a second.
const (
	attachRetry      = 100 * time.Millisecond
	attachMaxBackoff = 5 * time.Second
	attachWarnAfter  = 10 * time.Second
)

// clientOptions: lean, so that a kernel costs the daemon one connection
// (iopub, which says when a cell runs and reaches EOF when the kernel dies)
// and one goroutine (the client's, which reads iopub and calls the
// follower) between requests, instead of four sockets and 13 goroutines:
// at a thousand kernels their stacks and buffers were most of the daemon's
// memory. A hung but living kernel is not noticed (the heartbeat was the
// only check of that, and nothing acted on it). Reconnects retry quickly so
// that a restarted kernel gets its magics back soon.
//
// Memory per kernel is bounded by the frame limits: a shell or control
// message of at most 2×MaxFrameBytes (the magics' replies are JSON of a few
// KiB to a few MiB for thousands of variables), an iopub message of at most
// 2×64 KiB; a kernel that sends more is disconnected and attached again.
var clientOptions = protocol.Options{
	Lean:          true,
	MaxBackoff:    250 * time.Millisecond,
	MaxFrameBytes: 8 << 20,
}

// runKernel attaches to one kernel and hands it to a follower, which
// injects the magics into each of its processes and follows its life until
// ctx ends: only the scan decides that a kernel has shut down (its
// connection file gone for good), since ipykernel deletes and rewrites its
// file at start-up. It carries one count of d.wg: it ends it when ctx ends
// first, and otherwise hands it to the attached client's goroutine, the
// kernel's only goroutine from then on.
func (d *Daemon) runKernel(ctx context.Context, ks *kernelState) {
	for {
		f := &follower{d: d, ks: ks, ctx: ctx}
		c := d.attach(ctx, ks, f.onEvent)
		if c == nil {
			d.wg.Done()
			return
		}
		if f.attached(c) {
			return
		}
		c.Close() // it stopped, or ctx ended, before it was followed: attach again
	}
}

// attach dials the kernel until it answers or ctx ends (nil); the client
// passes its events to onEvent.
func (d *Daemon) attach(ctx context.Context, ks *kernelState, onEvent func(protocol.Event)) *protocol.Client {
	log := d.log.With().Str("kernel_id", ks.id).Str("connection_file", ks.connFile).Logger()
	start := time.Now()
	backoff := attachRetry
	d.mu.Lock()
	fileUID := ks.fileUID
	d.mu.Unlock()
	for {
		opts := clientOptions
		if ks.pod != nil {
			opts = d.podClientOptions(ks)
		} else {
			opts.ReadConnectionFile = ownedConnectionFile(fileUID)
		}
		opts.OnEvent = onEvent
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := protocol.Dial(actx, ks.connFile, opts)
		cancel()
		if err == nil {
			return c
		}
		if ctx.Err() != nil {
			return nil
		}
		// A kernel starting up refuses for a second or so: only a failure
		// that lasts is worth a warning (once per problemEvery per text).
		if time.Since(start) > attachWarnAfter {
			d.problem(fmt.Errorf("kernel %s: cannot attach (retrying): %w", ks.id, err))
		} else {
			log.Debug().Err(err).Dur("retry_in", backoff).Msg("attach failed")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, attachMaxBackoff)
	}
}

// ownedConnectionFile reads a host kernel's connection file at every
// (re)connect as discovery first read it: no link followed, a file of its
// dir's owner, and still of uid. A file replaced by one of another user
// (a hard link to their connection file, say) is not followed: the client
// keeps the key it had.
func ownedConnectionFile(uid uint32) func(string) (protocol.ConnectionInfo, error) {
	return func(path string) (protocol.ConnectionInfo, error) {
		k, err := discovery.ReadKernelFile(path)
		if err != nil {
			return protocol.ConnectionInfo{}, err
		}
		if k.FileUID != uid {
			return protocol.ConnectionInfo{}, &protocol.ConnectionFileError{Path: path,
				Err: fmt.Errorf("now belongs to uid %d, not to uid %d as when it was found: not followed", k.FileUID, uid)}
		}
		return k.Connection, nil
	}
}

// follower follows one attachment to a kernel through the client's events,
// on the client's goroutine: a thousand kernels cost the daemon a thousand
// goroutines, not two or three thousand.
type follower struct {
	d   *Daemon
	ks  *kernelState
	ctx context.Context

	mu       sync.Mutex
	c        *protocol.Client // nil until attached
	closed   bool             // the client stopped before attached
	injected <-chan struct{}  // closed when the latest injection has ended
	stop     func() bool      // stops closing the client when ctx ends
}

// attached starts following c, unless it has already stopped or ctx has
// ended (false).
// From here the client's goroutine carries runKernel's count of d.wg
// until its EventClosed.
func (f *follower) attached(c *protocol.Client) bool {
	d, ks := f.d, f.ks
	f.mu.Lock()
	defer f.mu.Unlock()
	d.mu.Lock()
	// The scan cancels ctx and starts a new follow of ks under d.mu: with
	// ctx live here, no newer follow has set ks.client.
	if f.closed || f.ctx.Err() != nil {
		d.mu.Unlock()
		return false
	}
	f.c = c
	ks.client = c
	notebook := ks.notebook // scan updates it under d.mu
	d.mu.Unlock()
	d.log.Info().Str("kernel_id", ks.id).Str("connection_file", ks.connFile).Str("notebook", notebook).Msg("attached")
	// jupyter_server 2 writes the connection file before the session names
	// the notebook: look again now rather than at the next rescan.
	d.disc.rescan()
	f.injected = d.startInject(f.ctx, ks, c, nil)
	f.stop = context.AfterFunc(f.ctx, func() { _ = c.Close() })
	return true
}

// onEvent is the client's OnEvent. It never blocks: what waits runs on a
// goroutine of its own.
func (f *follower) onEvent(ev protocol.Event) {
	d := f.d
	log := d.log.With().Str("kernel_id", f.ks.id).Logger()
	switch ev.Kind {
	case protocol.EventRestarted:
		log.Info().Str("session", ev.Session).Msg("kernel restarted")
		f.mu.Lock()
		if f.c != nil { // else attached injects
			f.injected = d.startInject(f.ctx, f.ks, f.c, f.injected)
		}
		f.mu.Unlock()
	case protocol.EventClosed:
		log.Debug().Err(ev.Err).Msg("client stopped; attaching again")
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.c == nil {
			f.closed = true
			return
		}
		c, injected, stop := f.c, f.injected, f.stop
		go func() {
			stop()
			_ = c.Close() // ends an injection still waiting for its reply
			<-injected
			d.mu.Lock()
			if f.ks.client == c { // a newer follow (the file written again) keeps its own
				f.ks.client = nil
			}
			d.mu.Unlock()
			d.runKernel(f.ctx, f.ks)
		}()
	case protocol.EventDead, protocol.EventDisconnected:
		log.Debug().Err(ev.Err).Str("event", ev.String()).Msg("kernel unreachable")
		d.sampleSoon() // a restart: retire the old process now, not at the next tick
	}
}

// startInject injects the magics in the background, once the injection
// that closes prev (if any) has ended: a busy kernel answers only after its
// current cell, which may take hours, so the wait is bounded by ctx alone
// (the request is already queued in the kernel).
func (d *Daemon) startInject(ctx context.Context, ks *kernelState, c *protocol.Client, prev <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	if !d.cfg.InjectMagics {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		d.mu.Lock()
		ks.injectSince = time.Now()
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			ks.injectSince = time.Time{}
			d.mu.Unlock()
		}()
		log := d.log.With().Str("kernel_id", ks.id).Str("connection_file", ks.connFile).Logger()
		opts := magics.InjectOptions{SidecarSocket: d.cfg.SocketPath, KernelID: ks.id}
		// The daemon's socket and alert file are paths of its own mount
		// namespace, not a pod's: there they could name other files
		// entirely, so a pod's kernel is given neither. A kernel reads its
		// own user's file (its process runs as its file's owner).
		if d.notebookAlerts() && ks.pod == nil {
			d.mu.Lock()
			uid := ks.fileUID
			d.mu.Unlock()
			opts.AlertFile = d.kernelAlertFile(uid)
		}
		if ks.pod != nil {
			opts.SidecarSocket = ""
		}
		res, err := magics.Inject(ctx, c, opts)
		switch {
		case errors.Is(err, magics.ErrUnsupportedKernel):
			log.Info().Str("reason", res.Reason).Msg("magics not injected")
		case err != nil:
			if ctx.Err() == nil {
				log.Warn().Err(err).Msg("injecting magics failed")
			}
		default:
			log.Info().Str("version", res.Version).Strs("frameworks", res.FrameworksLoaded).Msg("magics injected")
		}
	}()
	return done
}
