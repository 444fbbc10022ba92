package daemon

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// Settle waits for the sample after the call and for the reclaims it
// starts: a kernel that exited just before is retired and its orphans are
// ended before Settle returns, however long their end takes. Samples go
// on at a short interval: the reclaim's grace window judges the orphans by
// the readings taken meanwhile.
func TestSettleWaitsForTheReclaimOfAKernelThatJustExited(t *testing.T) {
	r, _, _ := twoKernelFiles(t, Config{Reclaim: true, Interval: 50 * time.Millisecond, Rescan: time.Hour})
	release := make(chan struct{})
	var ended []int
	r.d.deps.Terminate = func(ctx context.Context, pid int, _ uint64, _ time.Duration) (bool, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		ended = append(ended, pid)
		return false, nil
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() { done <- r.d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testenv.Poll(t, 10*time.Second, "Run's first sample to find both kernels", func() bool {
		got := r.report()
		return len(got["k1"]) == 4 && len(got["k2"]) == 2
	})
	r.exit(100) // kernel k1's process: its orphans 101 and 104 hold GPU memory

	settled := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(r.ctx, 20*time.Second)
		defer scancel()
		settled <- r.d.Settle(sctx)
	}()
	r.waitLog("ending orphan that holds GPU memory") // the first of two, held until release
	select {
	case err := <-settled:
		t.Fatalf("Settle returned (%v) while a reclaim was still under way", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-settled:
		if err != nil {
			t.Fatalf("Settle: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Settle did not return after the reclaim finished")
	}
	r.mu.Lock()
	got := sortInts(append([]int(nil), ended...))
	r.mu.Unlock()
	if !slices.Equal(got, []int{101, 104}) {
		t.Errorf("ended %v before Settle returned, want [101 104]", got)
	}
}

// With nothing to reclaim Settle returns after one sample; a ctx that ends
// first ends it with the ctx's error.
func TestSettleNothingToDoAndDeadline(t *testing.T) {
	r, _, _ := twoKernelFiles(t, Config{Reclaim: true, Interval: 50 * time.Millisecond, Rescan: time.Hour})
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() { done <- r.d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	sctx, scancel := context.WithTimeout(r.ctx, 20*time.Second)
	defer scancel()
	if err := r.d.Settle(sctx); err != nil {
		t.Fatalf("Settle with nothing to reclaim: %v", err)
	}
	if got := r.kills(); len(got) != 0 {
		t.Errorf("ended %v with no kernel gone", got)
	}
	// A daemon that never samples (Run not running): the deadline ends it.
	idle, _, _ := twoKernels(t, Config{Reclaim: true})
	dctx, dcancel := context.WithTimeout(r.ctx, 100*time.Millisecond)
	defer dcancel()
	if err := idle.d.Settle(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Settle without Run = %v, want the deadline", err)
	}
}

func TestInflight(t *testing.T) {
	var f inflight
	if err := f.wait(context.Background()); err != nil {
		t.Fatalf("wait with none under way: %v", err)
	}
	f.add()
	f.add()
	f.done()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := f.wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait with one under way = %v, want the deadline", err)
	}
	go f.done()
	if err := f.wait(context.Background()); err != nil {
		t.Fatalf("wait after the last done: %v", err)
	}
	f.add() // from zero again: a new round
	go f.done()
	if err := f.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}
