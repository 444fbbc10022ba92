package adversarial

import (
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// A kernel id from a file name, or a notebook named by a kernel's
// environment, may hold any bytes: neither may blank /metrics. Here one
// kernel's connection file is kernel-<invalid UTF-8>.json and another's
// JPY_SESSION_NAME holds invalid UTF-8 and an escape sequence; a third is
// plain. Every kernel's series must be served (the hostile values escaped)
// and gpumem_sample_success stay 1, so that alert rules still fire.
func TestMetricsSurviveHostileLabels(t *testing.T) {
	t.Parallel()
	dir := jupyterDir(t)
	plain := testenv.StartKernel(t, dir)
	badID := testenv.StartKernelID(t, dir, "bad\xff\xfe-"+testenv.RandomHex(4))
	badNB := testenv.StartKernel(t, dir, "JPY_SESSION_NAME=/home/eve/\xff\x1b[2J.ipynb")
	for _, k := range []*testenv.Kernel{plain, badID, badNB} {
		testenv.WaitKernelListening(t, k.ConnectionFile, 60*time.Second)
	}
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: plain.Cmd.Process.Pid, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: badID.Cmd.Process.Pid, UsedBytes: 2 << 30},
		testenv.FakeProc{PID: badNB.Cmd.Process.Pid, UsedBytes: 3 << 30})
	d := testenv.StartDaemon(t, gpumemBin, dir, gpu, "--interval=100ms", "--no-inject", "--listen=127.0.0.1:0")
	url := metricsURL(t, d)
	// All three kernels attributed: from then on every scrape must hold them.
	testenv.Poll(t, 60*time.Second, "the daemon attributes all three kernels", func() bool {
		n := 0
		for _, nb := range d.Report(t).Notebooks {
			if nb.GPUMemoryBytes > 0 {
				n++
			}
		}
		return n == 3
	})
	var body string
	want := []string{
		`gpumem_sample_success 1`,
		`kernel_id="` + plain.ID + `"`,
		`kernel_id="bad\\xff\\xfe-`,
		`notebook="/home/eve/\\xff\\x1b[2J.ipynb"`,
		`gpumem_user_gpu_memory_bytes{`,
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		body = scrapeMetrics(t, url)
		missing := ""
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s (one hostile label value must not hide any series):\n%s", missing, ours(body))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if strings.Contains(body, "\x1b") || strings.Contains(body, "\xff") {
		t.Errorf("/metrics carries a raw escape or invalid UTF-8:\n%q", ours(body))
	}
}

// ours is the gpumem_ lines of a /metrics body.
func ours(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "gpumem_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
