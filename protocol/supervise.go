package protocol

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/go-zeromq/zmq4"
)

// publish makes g the live generation.
func (c *Client) publish(g *generation, ki KernelInfo) {
	c.mu.Lock()
	c.gen = g
	c.kernel = ki
	close(c.ready)
	c.mu.Unlock()
	c.alive.Store(true)
}

// retire unpublishes g and closes it.
func (c *Client) retire(g *generation) {
	c.alive.Store(false)
	defer c.alive.Store(false) // again: g's heartbeat may have set it meanwhile
	c.mu.Lock()
	if c.gen == g {
		c.gen = nil
		c.ready = make(chan struct{})
	}
	c.mu.Unlock()
	c.execState.Store(nil)
	g.close()
}

// supervise owns the live generation: it reads its iopub until the
// generation fails, then rebuilds the connection, until Close or the
// connection file is deleted.
func (c *Client) supervise(g *generation) {
	defer c.wg.Done()
	defer close(c.stopped)
	for {
		c.readIOPub(g)
		if c.ctx.Err() != nil {
			c.retire(g)
			c.setStopErr(ErrClosed)
			c.emit(Event{Kind: EventClosed})
			return
		}
		c.alive.Store(false)
		c.emit(Event{Kind: EventDisconnected, Err: g.err})
		c.retire(g)
		var err error
		if g, err = c.reconnect(); g == nil {
			c.setStopErr(err)
			ev := Event{Kind: EventClosed}
			if !errors.Is(err, ErrClosed) {
				ev.Err = err
			}
			c.emit(ev)
			return
		}
	}
}

func (c *Client) setStopErr(err error) {
	c.mu.Lock()
	c.stopErr = err
	c.mu.Unlock()
}

const minBackoff = 50 * time.Millisecond

// reconnect retries connect with exponential backoff. It returns nil and
// the reason when the client must stop.
func (c *Client) reconnect() (*generation, error) {
	backoff := minBackoff
	missing := 0
	deadSent := false
	for {
		c.mu.Lock()
		info, prevSession := c.info, c.kernel.Session
		c.mu.Unlock()
		try := true
		if c.path != "" {
			fresh, err := c.opts.ReadConnectionFile(c.path)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// Twice in a row, so that a file being replaced is not
				// taken for a shutdown.
				if missing++; missing >= 2 {
					return nil, fmt.Errorf("%w: %s", ErrConnectionFileDeleted, c.path)
				}
				try = false
			case err != nil:
				// Being rewritten, or damaged: retry with what we had.
			default:
				missing = 0
				info = fresh
			}
		}
		if try {
			ctx, cancel := context.WithTimeout(c.ctx, c.opts.ConnectTimeout)
			g, ki, err := c.connect(ctx, info)
			cancel()
			if err == nil {
				c.mu.Lock()
				c.info = info
				c.mu.Unlock()
				c.publish(g, ki)
				if ki.Session != prevSession {
					c.emit(Event{Kind: EventRestarted, Session: ki.Session})
				} else {
					c.emit(Event{Kind: EventReconnected, Session: ki.Session})
				}
				return g, nil
			}
			if c.ctx.Err() != nil {
				return nil, ErrClosed
			}
			if !deadSent && isRefused(err) {
				deadSent = true
				c.emit(Event{Kind: EventDead, Err: err})
			}
		}
		t := time.NewTimer(backoff)
		select {
		case <-c.ctx.Done():
			t.Stop()
			return nil, ErrClosed
		case <-t.C:
		}
		backoff = min(2*backoff, c.opts.MaxBackoff)
	}
}

// eventBuffer: Events() is never sent on when OnEvent takes the events.
func eventBuffer(opts Options) int {
	if opts.OnEvent != nil {
		return 0
	}
	return 32
}

// emit delivers ev without ever blocking (unless OnEvent does): when the
// buffer is full the oldest event is dropped. Only the supervisor (and
// dial, before it starts) emits, so events are never sent after Close
// closes the channel.
func (c *Client) emit(ev Event) {
	ev.Time = time.Now()
	if c.opts.OnEvent != nil {
		c.opts.OnEvent(ev)
		return
	}
	for {
		select {
		case c.events <- ev:
			return
		default:
		}
		select {
		case <-c.events:
		default:
		}
	}
}

// heartbeat pings every HeartbeatInterval; an answer later than
// HeartbeatTimeout fails the generation.
func (c *Client) heartbeat(g *generation) {
	defer g.wg.Done()
	for {
		if err := g.hb.Send(zmq4.NewMsgString("ping")); err != nil {
			g.fail(fmt.Errorf("heartbeat: %w", err))
			return
		}
		// zmq4's REQ Recv blocks until an answer or Close, whatever ctx
		// says: the same goroutine waits for the answer, and a timer fails
		// the generation when none comes in time (its sockets are then
		// closed, which ends the Recv). One goroutine per kernel instead of
		// a sender and a receiver: a daemon follows a thousand kernels.
		timeout := time.AfterFunc(c.opts.HeartbeatTimeout, func() {
			g.fail(fmt.Errorf("%w: no answer within %v", ErrHeartbeatMissed, c.opts.HeartbeatTimeout))
		})
		_, err := g.hb.Recv()
		if !timeout.Stop() || g.ctx.Err() != nil {
			return // the generation failed (no answer in time) or is closing
		}
		if err != nil {
			g.fail(fmt.Errorf("heartbeat: %w", err))
			return
		}
		select {
		case <-g.failed:
		default:
			c.alive.Store(true)
		}
		wait := time.NewTimer(c.opts.HeartbeatInterval)
		select {
		case <-wait.C:
		case <-g.ctx.Done():
			wait.Stop()
			return
		}
	}
}
