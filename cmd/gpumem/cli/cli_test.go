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
		t.Fatalf("%v (go test ./cmd/gpumem/cli -update writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test ./cmd/gpumem/cli -update rewrites it):\n--- got ---\n%s\n--- want ---\n%s", name, got, want)
	}
}

const gib = 1 << 30

// sampleReport is a finished report's figures (display names as Finish
// sets them).
func sampleReport() attribution.Report {
	return attribution.Report{
		GPUs: []attribution.GPU{
			{Index: 0, UUID: "GPU-0", Name: "NVIDIA H200", MemoryTotalBytes: 141 * gib, MemoryUsedBytes: 60 * gib,
				NotebookBytes: 52 * gib, OtherBytes: 8 * gib, FreeBytes: 80 * gib, Utilization: &attribution.Utilization{SMPercent: 97, MemoryPercent: 12}},
			{Index: 1, UUID: "GPU-1", Name: "NVIDIA H200", MemoryTotalBytes: 141 * gib, Simulated: true, FreeBytes: 141 * gib,
				UtilizationMissing: "MIG: NVML reports no per-process utilization on MIG instances"},
		},
		Notebooks: []attribution.Notebook{
			{KernelID: "4c1f2e0a-aaaa", Notebook: "/home/alice/train.ipynb", DisplayName: "train.ipynb", PIDs: []int{812, 845}, User: "alice",
				GPUMemoryBytes: 40 * gib, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 40 * gib, Utilization: &attribution.Utilization{SMPercent: 97, MemoryPercent: 12}}}},
			{KernelID: "9d00be11-bbbb", Notebook: "/home/bob/eval.ipynb", DisplayName: "eval.ipynb", PIDs: []int{901}, User: "bob",
				GPUMemoryBytes: 12 * gib, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 12 * gib, Utilization: &attribution.Utilization{}}}},
			{KernelID: "77aa0000-cccc", Notebook: "", DisplayName: "kernel 77aa0000", PIDs: []int{990}, User: "carol"},
		},
		Other: []attribution.OtherProcess{
			{PID: 4242, User: "dave", Command: "python serve.py --port 8000", PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 8 * gib}}},
		},
		LeftRunning: []attribution.LeftRunning{{KernelID: "4c1f2e0a-aaaa", PID: 777, Message: "a job started from train.ipynb (pid 777, `python train.py`) is still computing on GPU 0 with 20.0 GiB: left running"}},
	}
}

func TestWriteLsGolden(t *testing.T) {
	var b bytes.Buffer
	if err := writeLs(&b, sampleReport(), tableWidth); err != nil {
		t.Fatal(err)
	}
	golden(t, "ls.txt", b.Bytes())
	b.Reset()
	if err := writeLs(&b, attribution.Report{}, tableWidth); err != nil {
		t.Fatal(err)
	}
	golden(t, "ls_empty.txt", b.Bytes())
}

// A child that holds only a CUDA context is flagged under its GPU, with the
// flag's cause and how to avoid it, as attribution computes them.
func TestWriteLsStrayGolden(t *testing.T) {
	rep := sampleReport()
	rep.Notebooks[0].Processes = []attribution.ProcessBytes{
		{PID: 812, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 40*gib - 518<<20}}},
		{PID: 845, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 518 << 20}}},
	}
	attribution.FlagStrayContexts(&rep, nil)
	var b bytes.Buffer
	if err := writeLs(&b, rep, tableWidth); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "stray context (≈ 518 MiB)") {
		t.Errorf("no stray context flag:\n%s", b.String())
	}
	golden(t, "ls_stray.txt", b.Bytes())
}

func TestWriteIdleGolden(t *testing.T) {
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	rep := sampleReport()
	rep.Notebooks[0].Activity = &attribution.Activity{ExecutionState: "idle", LastActivity: now.Add(-3 * time.Hour),
		IdleSeconds: 3 * 3600, CullAt: now.Add(5 * time.Minute), CullAction: "shutdown"}
	rep.Notebooks[1].Activity = &attribution.Activity{ExecutionState: "busy", LastActivity: now}
	hoarded := 12.5
	rep.Notebooks[0].Compute = &attribution.Compute{State: attribution.ComputeIdle, HoardedGiBHours: &hoarded}
	rep.Notebooks[1].Compute = &attribution.Compute{State: attribution.ComputeComputing, HoardedGiBHours: new(float64)}
	rep.Notebooks[2].Compute = &attribution.Compute{State: attribution.ComputeUnknown}
	rep.Hoarding = []attribution.UserHoarding{{User: "alice", GiBHours: 12.5, WindowSeconds: 86400}, {User: "bob", WindowSeconds: 86400}}
	var b bytes.Buffer
	if err := writeIdle(&b, rep, now, tableWidth); err != nil {
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
	if err := writeKernelTable(&b, rows, tableWidth); err != nil {
		t.Fatal(err)
	}
	golden(t, "kernels.txt", b.Bytes())
}

// longRows are what a real host lists: kernel ids of 36 characters, deep
// notebook paths, connection files in a temp dir, long commands.
func longReport() (attribution.Report, []kernelRow) {
	rep := sampleReport()
	rep.Notebooks[0].KernelID = "4c1f2e0a-1b2c-4d5e-8f90-123456789abc"
	rep.Notebooks[0].Notebook = "/home/alice/projects/vision/experiments/2026-11/resnet-finetune-with-long-name/train.ipynb"
	rep.Other[0].Command = "python -m vllm.entrypoints.openai.api_server --model /models/llama-3-70b-instruct --tensor-parallel-size 2"
	// Every column and line at its widest: a stray context, a planned
	// cull, GPU work and hoarding, a process left running.
	rep.Notebooks[0].Processes = []attribution.ProcessBytes{
		{PID: 812, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 40*gib - 518<<20}}},
		{PID: 845, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 518 << 20}}},
	}
	attribution.FlagStrayContexts(&rep, nil)
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	rep.Notebooks[0].Activity = &attribution.Activity{ExecutionState: "idle", LastActivity: now.Add(-27 * time.Hour),
		IdleSeconds: 27 * 3600, CullAt: now.Add(5 * time.Minute), CullAction: "shutdown"}
	hoarded := 1234.5
	rep.Notebooks[0].Compute = &attribution.Compute{State: attribution.ComputeComputing, HoardedGiBHours: &hoarded}
	rep.Hoarding = []attribution.UserHoarding{{User: "alice", GiBHours: hoarded, WindowSeconds: 86400}}
	rows := []kernelRow{
		{KernelID: "4c1f2e0a-1b2c-4d5e-8f90-123456789abc", Notebook: rep.Notebooks[0].Notebook, PID: 812345, Language: "python", Alive: true,
			ConnectionFile: "/home/alice/.local/share/jupyter/runtime/kernel-4c1f2e0a-1b2c-4d5e-8f90-123456789abc.json",
			ServerURL:      "http://127.0.0.1:8888/user/alice/"},
	}
	return rep, rows
}

// Tables fit 100 columns, cutting paths in their middle; --wide prints
// everything whole.
func TestTablesFit100Columns(t *testing.T) {
	rep, rows := longReport()
	now := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		write func(b *bytes.Buffer, width int) error
		whole []string // what --wide must print whole
	}{
		{"ls", func(b *bytes.Buffer, width int) error { return writeLs(b, rep, width) },
			[]string{rep.Notebooks[0].Notebook, rep.Other[0].Command, rep.Notebooks[0].KernelID,
				rep.GPUs[1].UtilizationMissing, rep.Notebooks[0].StrayContexts[0].Avoid, rep.LeftRunning[0].Message}},
		{"ls --idle", func(b *bytes.Buffer, width int) error { return writeIdle(b, rep, now, width) },
			[]string{rep.Notebooks[0].Notebook, rep.Notebooks[0].KernelID, rep.LeftRunning[0].Message}},
		{"kernels", func(b *bytes.Buffer, width int) error { return writeKernelTable(b, rows, width) },
			[]string{rows[0].Notebook, rows[0].ConnectionFile, rows[0].KernelID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.write(&b, tableWidth); err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
				if n := len([]rune(l)); n > tableWidth {
					t.Errorf("line of %d columns:\n%s", n, l)
				}
			}
			if !strings.Contains(b.String(), "…") || !strings.Contains(b.String(), "train.ipynb") {
				t.Errorf("want the long path cut in its middle, keeping its file name:\n%s", b.String())
			}
			b.Reset()
			if err := tc.write(&b, 0); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.whole {
				if !strings.Contains(b.String(), w) {
					t.Errorf("--wide lacks %q whole:\n%s", w, b.String())
				}
			}
			if strings.Contains(b.String(), "…") {
				t.Errorf("--wide cut something:\n%s", b.String())
			}
		})
	}
	var b bytes.Buffer
	if err := writeLs(&b, rep, tableWidth); err != nil {
		t.Fatal(err)
	}
	golden(t, "ls_cut.txt", b.Bytes())
}

func TestCutMiddleText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"/a/b/train.ipynb", 20, "/a/b/train.ipynb"},
		{"/home/alice/projects/deep/train.ipynb", 16, "/home…rain.ipynb"},
		{"/tmp/ünïcödé/päth/é.ipynb", 11, "/tm…é.ipynb"},
		{"abcdef", 1, "a"},
	} {
		if got := cutMiddleText(tc.in, tc.n); got != tc.want || len([]rune(got)) > tc.n {
			t.Errorf("cutMiddleText(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestWriteProse(t *testing.T) {
	for _, tc := range []struct {
		name, indent string
		hang, width  int
		in, want     string
	}{
		{"fits", "  ", 2, 20, "GPU 0  SM 97%", "  GPU 0  SM 97%\n"},
		{"whole with no width", "", 2, 0, "one two three four", "one two three four\n"},
		{"broken between words, hanging", "", 2, 10, "one two three four", "one two\n  three\n  four\n"},
		{"runs of spaces kept inside a line", "", 0, 12, "GPU 0  H200  SM 97%", "GPU 0  H200\nSM 97%\n"},
		{"a word longer than a line stays whole", "", 0, 5, "abcdefgh ij", "abcdefgh\nij\n"},
		{"an indent wider than the line", "      ", 0, 4, "ab cd", "      ab\n      cd\n"},
		{"runes, not bytes", "", 0, 6, "ünïcö dé", "ünïcö\ndé\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			writeProse(&b, tc.indent, tc.hang, tc.in, tc.width)
			if b.String() != tc.want {
				t.Errorf("writeProse(%q, %d) = %q, want %q", tc.in, tc.width, b.String(), tc.want)
			}
		})
	}
}

func TestGiBHours(t *testing.T) {
	for v, want := range map[float64]string{0: "0.0 GiB·h", 12.5: "12.5 GiB·h", 99.994: "100.0 GiB·h", 999.94: "999.9 GiB·h", 999.96: "1000 GiB·h", 1234.5: "1234 GiB·h"} {
		if got := gibHours(v); got != want {
			t.Errorf("gibHours(%v) = %q, want %q", v, got, want)
		}
	}
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
		{[]string{"ls", "--bogus"}, 2, "unknown flag --bogus (gpumem ls -h lists its flags)"},
		{[]string{"serve", "--socket-mode=open"}, 2, "socket-mode"},
		{[]string{"serve", "--alert-threshold=2"}, 2, "between 0 and 1"},
		// Not in a cluster (with -tags kubernetes), or a build without
		// client-go: either way a clear error, before anything starts.
		{[]string{"serve", "--kubernetes"}, 1, "--kubernetes: "},
		{[]string{"free"}, 2, "missing KERNEL"},
		{[]string{"free", "k", "--vars", "1bad"}, 2, ""},
		{[]string{"attach", "a", "b"}, 2, `unexpected argument "b": gpumem attach takes only KERNEL`},
		{[]string{"help"}, 0, ""},
		{[]string{"version"}, 0, ""},
		// Nonsense values: refused before anything starts, naming the flag.
		{[]string{"serve", "--interval=0"}, 2, "--interval=0s: want a duration above 0"},
		{[]string{"serve", "--interval=-1s"}, 2, "--interval=-1s"},
		{[]string{"serve", "--rescan=0"}, 2, "--rescan=0s"},
		{[]string{"serve", "--reclaim-grace=-1s"}, 2, "--reclaim-grace=-1s"},
		{[]string{"serve", "--runtime-dir=/nonexistent/gpumem-test"}, 2, "/nonexistent/gpumem-test: no such directory"},
		{[]string{"serve", "--runtime-dir=/etc/hostname"}, 2, "/etc/hostname: not a directory"},
		{[]string{"serve", "--cull-min-memory=8GiB"}, 2, "--cull-min-memory applies to culling, which is off: give --cull-idle"},
		{[]string{"serve", "--cull-action=shutdown"}, 2, "--cull-action applies to culling"},
		{[]string{"serve", "--cull-idle=-1h"}, 2, "--cull-idle=-1h0m0s"},
		{[]string{"ls", "--runtime-dir", "/nonexistent/gpumem-test"}, 2, "no such directory"},
		{[]string{"kernels", "--timeout=0"}, 2, "--timeout=0s"},
		{[]string{"attach", "abcd", "--timeout=0"}, 2, "--timeout=0s"},
		// A kernel to change is named by at least 4 characters of its id.
		{[]string{"free", "0"}, 2, `"0" is too short to name the kernel to change: give at least 4 characters`},
		{[]string{"free", "abc", "--all"}, 2, "too short"},
		// --pid confirms processes to end: with --orphans or --children only.
		{[]string{"free", "abcd", "--pid", "12"}, 2, "--pid goes with --orphans or --children"},
		{[]string{"free", "abcd", "--children", "--orphans", "--pid", "12"}, 2, "--pid goes with --orphans or --children"},
		{[]string{"free", "abcd", "--children", "--pid", "x"}, 2, `--pid: "x" is not a process id`},
		{[]string{"free", "abcd", "--children", "--pid", ","}, 2, "--children --pid names no process"},
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

func TestMatchLeftRunning(t *testing.T) {
	left := []attribution.LeftRunning{
		{KernelID: "4c1f2e0a-aaaa", Notebook: "/home/alice/train.ipynb", PID: 1},
		{KernelID: "4c1f2e0a-aaaa", Notebook: "/home/alice/train.ipynb", PID: 2},
		{KernelID: "4c9900aa-bbbb", Notebook: "/home/alice/eval.ipynb", PID: 3},
	}
	for _, tc := range []struct{ arg, want, err string }{
		{"4c1f2e0a-aaaa", "4c1f2e0a-aaaa", ""},
		{"4c1f", "4c1f2e0a-aaaa", ""},
		{"train.ipynb", "4c1f2e0a-aaaa", ""},
		{"/home/alice/eval.ipynb", "4c9900aa-bbbb", ""},
		{"4c", "", "matches 2 kernels"},
		{"nope", "", "no kernel with processes left running matches"},
	} {
		got, err := matchLeftRunning(left, tc.arg)
		if got != tc.want || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %q, %v; want %q, %q", tc.arg, got, err, tc.want, tc.err)
		}
	}
	if _, err := matchLeftRunning(nil, "x"); err == nil || !strings.Contains(err.Error(), "left no process running") {
		t.Errorf("nothing left running: %v", err)
	}
	if _, err := parsePIDs("12, 0"); err == nil {
		t.Error("pid 0 parsed")
	}
}

// Help goes to stdout (gpumem serve -h | less), exit 0; mistakes are one
// line on stderr.
func TestHelpOnStdout(t *testing.T) {
	for _, cmd := range []string{"serve", "ls", "kernels", "attach", "free"} {
		var out, errb bytes.Buffer
		env := Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
		if code := Run(context.Background(), []string{cmd, "--help"}, env); code != 0 {
			t.Errorf("gpumem %s --help: exit %d", cmd, code)
		}
		if !strings.HasPrefix(out.String(), "Usage: gpumem "+cmd) || !strings.Contains(out.String(), "  --runtime-dir") || errb.Len() != 0 {
			t.Errorf("gpumem %s --help: stdout %q, stderr %q; want the help on stdout only", cmd, out.String(), errb.String())
		}
	}
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	Run(context.Background(), []string{"ls", "--bogus"}, env)
	if out.Len() != 0 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), "gpumem ls -h lists its flags") {
		t.Errorf("a bad flag: stdout %q, stderr %q; want one line on stderr", out.String(), errb.String())
	}
}

// serve -h lists every flag once, under its group's heading.
func TestServeHelpGroups(t *testing.T) {
	var out bytes.Buffer
	env := Env{Stdout: &out, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	if code := Run(context.Background(), []string{"serve", "-h"}, env); code != 0 {
		t.Fatalf("exit %d", code)
	}
	help := out.String()
	at := -1
	for _, title := range []string{"Sampling:", "Reclaim", "Culling", "Shared host", "Kubernetes:"} {
		i := strings.Index(help, "\n"+title)
		if i < 0 || i < at {
			t.Errorf("serve -h: heading %q missing or out of order:\n%s", title, help)
		}
		at = i
	}
	for _, g := range serveFlagGroups {
		for _, f := range g.flags {
			if n := strings.Count(help, "\n  --"+f+" ") + strings.Count(help, "\n  --"+f+"\n"); n != 1 {
				t.Errorf("serve -h lists --%s %d times", f, n)
			}
		}
	}
	if strings.Contains(help, "\nOther:") {
		t.Errorf("serve -h has flags in no group (add them to serveFlagGroups):\n%s", help)
	}
	if !strings.Contains(help, "(default 1s)") {
		t.Errorf("serve -h lacks the defaults:\n%s", help)
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
