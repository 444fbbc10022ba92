package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpumem/gpumem/magics"
	"github.com/gpumem/gpumem/protocol"
)

// TestFakeKernelAnswersGpumem: gpumem's own client attaches to a fake
// kernel, and the magics' injection succeeds against it; the kernel counts
// what it received and deletes its file when stopped.
func TestFakeKernelAnswersGpumem(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(t.TempDir(), "kernel-fake.json")
	k, err := start(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	c, err := protocol.Dial(ctx, path, protocol.Options{HeartbeatInterval: 50 * time.Millisecond})
	if err != nil {
		k.stop()
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	res, err := magics.Inject(rctx, c, magics.InjectOptions{KernelID: "fake"})
	rcancel()
	if err != nil || !res.Injected {
		t.Errorf("inject: %+v, %v", res, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		k.mu.Lock()
		beats := k.received["hb/ping"]
		k.mu.Unlock()
		if beats > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat received")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = c.Close()
	k.stop()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.received["control/kernel_info_request"] == 0 || k.received["shell/execute_request"] != 1 {
		t.Errorf("received %v: want kernel_info on control and one execute on shell", k.received)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("connection file still there after stop: %v", err)
	}
}
