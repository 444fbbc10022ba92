package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./internal/cli -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test ./internal/cli -update rewrites it):\n--- got ---\n%s\n--- want ---\n%s", name, got, want)
	}
}

const gib = 1 << 30

func sampleReport() attribution.Report {
	return attribution.Report{
		GPUs: []attribution.GPU{
			{Index: 0, UUID: "GPU-0", Name: "NVIDIA H200", MemoryTotalBytes: 141 * gib, MemoryUsedBytes: 60 * gib,
				NotebookBytes: 52 * gib, OtherBytes: 8 * gib, FreeBytes: 80 * gib},
			{Index: 1, UUID: "GPU-1", Name: "NVIDIA H200", MemoryTotalBytes: 141 * gib, Simulated: true, FreeBytes: 141 * gib},
		},
		Notebooks: []attribution.Notebook{
			{KernelID: "4c1f2e0a-aaaa", Notebook: "/home/alice/train.ipynb", PIDs: []int{812, 845}, User: "alice",
				GPUMemoryBytes: 40 * gib, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 40 * gib}}},
			{KernelID: "9d00be11-bbbb", Notebook: "/home/bob/eval.ipynb", PIDs: []int{901}, User: "bob",
				GPUMemoryBytes: 12 * gib, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 12 * gib}}},
			{KernelID: "77aa0000-cccc", Notebook: "", PIDs: []int{990}, User: "carol"},
		},
		Other: []attribution.OtherProcess{
			{PID: 4242, User: "dave", Command: "python serve.py --port 8000", PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 8 * gib}}},
		},
	}
}

func TestWriteLsGolden(t *testing.T) {
	var b bytes.Buffer
	if err := writeLs(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	golden(t, "ls.txt", b.Bytes())
	b.Reset()
	if err := writeLs(&b, attribution.Report{}); err != nil {
		t.Fatal(err)
	}
	golden(t, "ls_empty.txt", b.Bytes())
}

func TestWriteIdleGolden(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	rep := sampleReport()
	rep.Notebooks[0].Activity = &attribution.Activity{ExecutionState: "idle", LastActivity: now.Add(-3 * time.Hour),
		IdleSeconds: 3 * 3600, CullAt: now.Add(5 * time.Minute), CullAction: "shutdown"}
	rep.Notebooks[1].Activity = &attribution.Activity{ExecutionState: "busy", LastActivity: now}
	var b bytes.Buffer
	if err := writeIdle(&b, rep, now); err != nil {
		t.Fatal(err)
	}
	golden(t, "ls_idle.txt", b.Bytes())
}

func TestWriteKernelTableGolden(t *testing.T) {
	var b bytes.Buffer
	rows := []kernelRow{
		{KernelID: "4c1f2e0a-aaaa", Notebook: "/home/alice/train.ipynb", PID: 812, Language: "python", Alive: true,
			ConnectionFile: "/run/jupyter/kernel-4c1f2e0a-aaaa.json", ServerURL: "http://127.0.0.1:8888/"},
		{KernelID: "77aa0000-cccc", ConnectionFile: "/run/jupyter/kernel-77aa0000-cccc.json"},
	}
	if err := writeKernelTable(&b, rows); err != nil {
		t.Fatal(err)
	}
	golden(t, "kernels.txt", b.Bytes())
}

func TestWatchFlag(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		on      bool
		every   time.Duration
		wantErr string
	}{
		{nil, false, 0, ""},
		{[]string{"--watch"}, true, 2 * time.Second, ""},
		{[]string{"--watch=500ms"}, true, 500 * time.Millisecond, ""},
		{[]string{"--watch=soon"}, false, 0, "not a duration"},
		{[]string{"--watch=1ms"}, false, 0, "shorter than 100ms"},
	} {
		fs := flag.NewFlagSet("ls", flag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		var w watchFlag
		fs.Var(&w, "watch", "")
		err := fs.Parse(tc.args)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil || w.on != tc.on || (tc.on && w.interval != tc.every) {
			t.Errorf("%v: on=%v every=%v err=%v; want on=%v every=%v", tc.args, w.on, w.interval, err, tc.on, tc.every)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		code     int
		inStderr string
	}{
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{"ls", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"serve", "--socket-mode=open"}, 2, "socket-mode"},
		{[]string{"serve", "--alert-threshold=2"}, 2, "between 0 and 1"},
		// Not in a cluster (with -tags kubernetes), or a build without
		// client-go: either way a clear error, before anything starts.
		{[]string{"serve", "--kubernetes"}, 1, "--kubernetes: "},
		{[]string{"free"}, 2, "want exactly one KERNEL"},
		{[]string{"free", "k", "--vars", "1bad"}, 2, ""},
		{[]string{"attach", "a", "b"}, 2, "want exactly one KERNEL"},
		{[]string{"help"}, 0, ""},
		{[]string{"version"}, 0, ""},
		{[]string{"--version"}, 0, ""},
		{[]string{"version", "extra"}, 2, "takes no arguments"},
	} {
		var out, errb bytes.Buffer
		env := Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
		if code := Run(context.Background(), tc.args, env); code != tc.code || !strings.Contains(errb.String(), tc.inStderr) {
			t.Errorf("gpumem %v: exit %d, stderr %q; want exit %d with %q", tc.args, code, errb.String(), tc.code, tc.inStderr)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"version"}, `^gpumem \d+\.\d+\.\d+\S* \(commit ([0-9a-f]+(-dirty)?|unknown)\)\n$`},
		{[]string{"--version"}, `^gpumem \d+\.\d+\.\d+\S* \(commit `},
		{[]string{"version", "--json"}, `^\{"version":"\d+\.\d+\.\d+\S*","commit":"\S+"\}\n$`},
	} {
		var out bytes.Buffer
		env := Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
		if code := Run(context.Background(), tc.args, env); code != 0 || !regexp.MustCompile(tc.want).MatchString(out.String()) {
			t.Errorf("gpumem %v: exit %d, output %q; want exit 0 and %s", tc.args, code, out.String(), tc.want)
		}
	}
}

// serve --exit-with-parent that fails to start (here: a simulated-GPU file
// that is not there) says why and exits, rather than waiting for its parent.
func TestServeWithParentFailsAtOnce(t *testing.T) {
	var out, errb bytes.Buffer
	dir := t.TempDir()
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		switch k {
		case "GPUMEM_FAKE_GPU":
			return filepath.Join(dir, "missing.json")
		case "JUPYTER_RUNTIME_DIR":
			return filepath.Join(dir, "runtime")
		}
		return ""
	}}
	done := make(chan int, 1)
	go func() {
		done <- Run(context.Background(), []string{"serve", "--exit-with-parent=" + strconv.Itoa(os.Getppid())}, env)
	}()
	select {
	case code := <-done:
		if code != 1 || !strings.Contains(errb.String(), "missing.json") {
			t.Errorf("exit %d, stderr %q; want 1 naming the simulated-GPU file", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve --exit-with-parent did not return after failing to start")
	}
}
