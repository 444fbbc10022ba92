package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/nvml/driver"
)

// TestScanShutdownOnlyWhenFileDeleted: a connection file that a scan meets
// half-written (ipykernel rewrites it at start-up) is not a shutdown; a
// deleted one is.
func TestScanShutdownOnlyWhenFileDeleted(t *testing.T) {
	dir := t.TempDir()
	gpuFile := filepath.Join(dir, "gpus.json")
	if err := os.WriteFile(gpuFile, []byte(`{"gpus":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{RuntimeDirs: []string{dir}, SocketPath: filepath.Join(dir, "gpumem.sock")}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	d.gpus, err = driver.Open(driver.Options{FakeGPUFile: gpuFile})
	if err != nil {
		t.Fatal(err)
	}
	defer d.gpus.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); d.wg.Wait() }()

	cf := filepath.Join(dir, "kernel-k1.json")
	good := `{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"stdin_port":3,"control_port":4,"hb_port":5,"key":"k","signature_scheme":"hmac-sha256"}`
	known := func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, ok := d.kernels[cf]
		return ok
	}
	write := func(s string) {
		if err := os.WriteFile(cf, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(good)
	d.scan(ctx)
	if !known() {
		t.Fatal("kernel not found")
	}
	write(`{"shell_port":`) // mid-rewrite
	d.scan(ctx)
	if !known() {
		t.Fatal("a half-written connection file was taken for a shutdown")
	}
	// ipykernel deletes and rewrites its file: a moment's absence is no
	// shutdown.
	if err := os.Remove(cf); err != nil {
		t.Fatal(err)
	}
	d.scan(ctx)
	if !known() {
		t.Fatal("a connection file missing for a moment was taken for a shutdown")
	}
	write(good)
	d.scan(ctx)
	if !known() {
		t.Fatal("kernel lost after its file was rewritten")
	}
	// Deleted for good: a shutdown, decided on a scan missingGrace later.
	if err := os.Remove(cf); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	deadline := start.Add(5 * time.Second)
	for known() {
		if time.Now().After(deadline) {
			t.Fatal("a deleted connection file was not taken for a shutdown")
		}
		d.scan(ctx)
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	if el := time.Since(start); el < missingGrace {
		t.Errorf("shutdown decided after %v, before the %v grace", el, missingGrace)
	}
}
