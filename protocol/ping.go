package protocol

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrNoHeartbeat: the kernel did not echo a heartbeat before the deadline.
var ErrNoHeartbeat = errors.New("no heartbeat answer")

// Ping sends one heartbeat to the kernel described by info and waits for its
// echo until ctx ends. Unlike any request, a heartbeat is invisible to
// Jupyter: it does not show the kernel busy or reset its idle-cull clock. It
// answers even while a cell runs.
func Ping(ctx context.Context, info ConnectionInfo) error {
	if err := info.validate(); err != nil {
		return err
	}
	if err := registerTransports(); err != nil {
		return err
	}
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Millisecond)
	}
	sctx, cancel := context.WithCancel(context.WithValue(ctx, guardKey{}, newGuardConfig(Limits{}, timeout, nil)))
	defer cancel()
	hb := zmq4.NewReq(sctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(timeout),
		zmq4.WithTimeout(timeout), zmq4.WithLogger(discardLogger))
	// Recv has no timeout and ignores ctx: only Close unblocks it, so the
	// answer is awaited in a goroutine that Close ends.
	done := make(chan error, 1)
	go func() {
		if err := hb.Dial(info.endpoint(info.HBPort)); err != nil {
			done <- fmt.Errorf("dial heartbeat: %w", err)
			return
		}
		if err := hb.Send(zmq4.NewMsgString("ping")); err != nil {
			done <- fmt.Errorf("heartbeat: %w", err)
			return
		}
		_, err := hb.Recv()
		done <- err
	}()
	select {
	case err := <-done:
		hb.Close()
		return err
	case <-ctx.Done():
		hb.Close()
		cancel()
		<-done
		return fmt.Errorf("%w within the deadline: %v", ErrNoHeartbeat, ctx.Err())
	}
}
