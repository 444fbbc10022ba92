package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/nvml"
	"github.com/gpumem/gpumem/sidecar/attribution"
	"github.com/gpumem/gpumem/sidecar/procs"
)

// noDriverReport is what ls builds where the driver could not be opened:
// the no-driver source's snapshot, attributed as lsSampler does.
func noDriverReport(t *testing.T) attribution.Report {
	t.Helper()
	src := nvml.NoDriver(errors.New("libnvidia-ml.so.1: cannot open shared object file"))
	snap, err := src.Sample(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	kernels := []attribution.Kernel{{ID: "4c1f2e0a-aaaa", ConnectionFile: "/tmp/kernel-4c1f2e0a-aaaa.json", Notebook: "train.ipynb"}}
	obs, err := attribution.ObserveSnapshot(snap, lineage{&procs.FS{Root: t.TempDir()}}, kernels)
	if err != nil {
		t.Fatal(err)
	}
	rep := obs.Report
	attribution.Finish(&rep, attribution.FinishInput{Now: time.Now(), Table: obs.Table})
	return rep
}

// TestNoDriverSaysNA: without a driver, ls and ls --idle give no figure
// of GPU memory ("0 B" would say the kernel holds none) but one sentence
// with the next step; with a GPU, the kernel's "0 B" is a figure.
func TestNoDriverSaysNA(t *testing.T) {
	rep := noDriverReport(t)
	if len(rep.GPUs) != 0 || len(rep.Notebooks) != 1 {
		t.Fatalf("no-driver report: %d GPUs, %d notebooks; want 0 and 1", len(rep.GPUs), len(rep.Notebooks))
	}
	for name, write := range map[string]func(*bytes.Buffer) error{
		"ls":        func(b *bytes.Buffer) error { return writeLs(b, rep, tableWidth) },
		"ls --idle": func(b *bytes.Buffer) error { return writeIdle(b, rep, time.Now(), tableWidth) },
	} {
		var b bytes.Buffer
		if err := write(&b); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if strings.Contains(out, "0 B") || !strings.Contains(out, "GPU n/a") || !strings.Contains(out, "nvidia-smi") {
			t.Errorf("%s without a driver:\n%s\nwant no \"0 B\", and GPU n/a with the next step", name, out)
		}
		if strings.Count(out, "GPU n/a") != 1 {
			t.Errorf("%s without a driver says GPU n/a %d times:\n%s", name, strings.Count(out, "GPU n/a"), out)
		}
	}
	// The innocent: a GPU seen, the kernel holding nothing on it, is 0 B.
	rep.GPUs = []attribution.GPU{{Index: 0, Name: "H200", MemoryTotalBytes: 1 << 30}}
	var b bytes.Buffer
	if err := writeIdle(&b, rep, time.Now(), tableWidth); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "0 B") || strings.Contains(out, "n/a") {
		t.Errorf("ls --idle with a GPU:\n%s\nwant 0 B and no n/a", out)
	}
}

// TestLsIdleNoDriverRun: the whole command on this host, when it has no
// driver and no simulated GPU (the check above covers a host with one).
func TestLsIdleNoDriverRun(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this host has an NVIDIA driver")
	}
	var out, errb bytes.Buffer
	home := t.TempDir() // no runtime dir, no daemon's socket: standalone
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		if k == "JUPYTER_RUNTIME_DIR" || k == "HOME" {
			return home
		}
		return ""
	}}
	if code := Run(context.Background(), []string{"ls", "--idle"}, env); code != 0 {
		t.Fatalf("ls --idle: exit %d, stderr %q", code, errb.String())
	}
	// The sentence as said, its line breaks aside (it wraps at the width).
	said := strings.Join(strings.Fields(out.String()), " ")
	if !strings.Contains(said, "GPU n/a: "+nvml.NoDriverWarning) || !strings.Contains(errb.String(), nvml.NoDriverWarning) {
		t.Errorf("ls --idle without a driver: stdout %q, stderr %q", out.String(), errb.String())
	}
}
