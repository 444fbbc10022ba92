package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
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
	client    *protocol.Client
	injected  string // magics version injected into the current process
	attachAt  time.Time
}

func newKernelState(k discovery.Kernel) *kernelState {
	return &kernelState{id: k.ID, connFile: k.ConnectionFile, notebook: k.Notebook,
		serverURL: k.ServerURL, recorded: map[procID]recordedProc{}}
}

func (p procID) isZero() bool { return p.PID == 0 }

// observe records the live kernel process's tree in table and forgets
// recorded processes that have exited (a kernel that starts workers every
// epoch must not grow the set without bound); a recorded process that left
// the tree but lives on (setsid, reparented) stays recorded. It reports
// false, changing nothing, when the kernel process itself is gone. Called
// with Daemon.mu held.
func (ks *kernelState) observe(table *procs.Table) bool {
	kp, alive := table.Lookup(ks.cur.PID, ks.cur.Start)
	if !alive {
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
			rec = recordedProc{UID: p.UID, Argv: shortArgv(p.Argv)}
		}
		ks.recorded[id] = rec
	}
	return true
}

// takeRecordedLocked hands over the recorded set and starts a new one.
func (ks *kernelState) takeRecordedLocked() map[procID]recordedProc {
	r := ks.recorded
	ks.recorded = map[procID]recordedProc{}
	return r
}

// runKernel attaches to one kernel, injects the magics into each of its
// processes, and follows its life until its connection file goes or ctx ends.
func (d *Daemon) runKernel(ctx context.Context, ks *kernelState) {
	log := d.log.With().Str("kernel_id", ks.id).Logger()
	var c *protocol.Client
	backoff := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var err error
		c, err = protocol.Dial(actx, ks.connFile, protocol.Options{})
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		if _, serr := os.Stat(ks.connFile); errors.Is(serr, fs.ErrNotExist) {
			return
		}
		log.Debug().Err(err).Dur("retry_in", backoff).Msg("attach failed")
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	defer c.Close()
	d.mu.Lock()
	ks.client = c
	ks.attachAt = time.Now()
	notebook := ks.notebook // scan updates it under d.mu
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		ks.client = nil
		d.mu.Unlock()
	}()
	log.Info().Str("notebook", notebook).Msg("attached")

	injectDone := d.startInject(ctx, ks, c)
	for {
		select {
		case <-ctx.Done():
			<-injectDone
			return
		case ev, ok := <-c.Events():
			if !ok {
				<-injectDone
				return
			}
			switch ev.Kind {
			case protocol.EventRestarted:
				log.Info().Str("session", ev.Session).Msg("kernel restarted")
				<-injectDone
				injectDone = d.startInject(ctx, ks, c)
			case protocol.EventClosed:
				<-injectDone
				return
			case protocol.EventDead, protocol.EventDisconnected:
				log.Debug().Err(ev.Err).Str("event", ev.String()).Msg("kernel unreachable")
			}
		}
	}
}

// startInject injects the magics in the background: a busy kernel answers
// only after its current cell, which may take hours, so the wait is bounded
// by ctx alone (the request is already queued in the kernel).
func (d *Daemon) startInject(ctx context.Context, ks *kernelState, c *protocol.Client) <-chan struct{} {
	done := make(chan struct{})
	if !d.cfg.InjectMagics {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		log := d.log.With().Str("kernel_id", ks.id).Logger()
		opts := magics.InjectOptions{SidecarSocket: d.socket, KernelID: ks.id}
		if d.cfg.NotebookAlerts && d.cfg.AlertThreshold > 0 {
			opts.AlertFile = d.alertFile()
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
			d.mu.Lock()
			ks.injected = res.Version
			d.mu.Unlock()
			log.Info().Str("version", res.Version).Strs("frameworks", res.FrameworksLoaded).Msg("magics injected")
		}
	}()
	return done
}
