package metrics

import (
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

// Label values others control (an invalid-UTF-8 kernel id from a file
// name, a notebook path from a kernel's environment with escapes, a user
// or pod name) never fail a scrape or hide another series: every family is
// served, with the values shown escaped.
func TestHostileLabelValues(t *testing.T) {
	pod := &attribution.Pod{Name: "pod\xff", Namespace: "ns\x1b[2J", Container: "c", User: "u\xfe"}
	snap := testSnapshot()
	snap.Report.Notebooks = append(snap.Report.Notebooks,
		attribution.Notebook{KernelID: "bad\xffid", Notebook: "/home/eve/\x1b[2J\xfe.ipynb", User: "eve\xff", PIDs: []int{501},
			GPUMemoryBytes: gib, PeakBytes: 2 * gib, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: gib, Utilization: util(3, 1)}},
			Processes: []attribution.ProcessBytes{{PID: 501, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: gib, Utilization: util(3, 1)}}}},
			Activity:  &attribution.Activity{ExecutionState: "idle", IdleSeconds: 30},
			Compute:   &attribution.Compute{State: attribution.ComputeIdle, HoardedGiBHours: hours(1)}},
		attribution.Notebook{KernelID: "k-pod", Notebook: "/p\xff.ipynb", Pod: pod, PIDs: []int{502},
			GPUMemoryBytes: gib, PerGPU: []attribution.GPUBytes{{Index: 1, Bytes: gib}}},
		// Shown alike once escaped ("\xff" as text): summed, not a duplicate.
		attribution.Notebook{KernelID: `bad\xffid`, Notebook: `/home/eve/\x1b[2J\xfe.ipynb`, User: `eve\xff`, PIDs: []int{503},
			GPUMemoryBytes: gib, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: gib}}},
	)
	snap.Report.GPUs[0].Name = "H200\xff"
	snap.Report.Hoarding = append(snap.Report.Hoarding, attribution.UserHoarding{User: "eve\xff", GiBHours: 1})
	m := New(&fakeSource{snap: snap}, zerolog.New(io.Discard))
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	got := map[string]bool{}
	for _, f := range fams {
		got[f.GetName()] = true
	}
	for _, want := range []string{"gpumem_sample_success", "gpumem_notebook_gpu_memory_bytes", "gpumem_user_gpu_memory_bytes",
		"gpumem_gpu_memory_used_bytes", "gpumem_idle_gpu_memory_bytes", "gpumem_notebook_gpu_memory_peak_bytes",
		"gpumem_pod_gpu_memory_bytes", "gpumem_last_sample_timestamp_seconds",
		// GPU work's families: the same label values, made safe the same way.
		"gpumem_notebook_gpu_sm_utilization_ratio", "gpumem_process_gpu_sm_utilization_ratio", "gpumem_notebook_gpu_computing",
		"gpumem_notebook_hoarded_gpu_memory_byte_seconds", "gpumem_user_hoarded_gpu_memory_byte_seconds"} {
		if !got[want] {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	want := `# HELP gpumem_notebook_gpu_memory_bytes GPU memory held by the processes of a notebook's kernel, in bytes.
# TYPE gpumem_notebook_gpu_memory_bytes gauge
gpumem_notebook_gpu_memory_bytes{gpu="0",kernel_id="bad\\xffid",notebook="/home/eve/\\x1b[2J\\xfe.ipynb",user="eve\\xff"} 2.147483648e+09
gpumem_notebook_gpu_memory_bytes{gpu="0",kernel_id="kernel-a",notebook="/home/alice/a.ipynb",user="alice"} 7.516192768e+10
gpumem_notebook_gpu_memory_bytes{gpu="0",kernel_id="kernel-b",notebook="/home/bob/b.ipynb",user="bob"} 1.073741824e+10
gpumem_notebook_gpu_memory_bytes{gpu="1",kernel_id="k-pod",notebook="/p\\xff.ipynb",user=""} 1.073741824e+09
gpumem_notebook_gpu_memory_bytes{gpu="1",kernel_id="kernel-b",notebook="/home/bob/b.ipynb",user="bob"} 1.073741824e+10
# HELP gpumem_sample_success 1 when the last sample of GPU memory succeeded, else 0.
# TYPE gpumem_sample_success gauge
gpumem_sample_success 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"gpumem_notebook_gpu_memory_bytes", "gpumem_sample_success"); err != nil {
		t.Error(err)
	}
}

// A metric that client_golang refuses costs its own sample only: the
// other samples of its family and every later family are still sent.
func TestSeriesRefusedMetricIsolated(t *testing.T) {
	d := prometheus.NewDesc("test_gauge", "A test gauge.", []string{"a"}, nil)
	ch := make(chan prometheus.Metric, 10)
	s := newSeries(ch)
	s.gauge(d, 1, "x")
	s.gauge(d, 2, "x", "extra") // wrong number of labels: refused
	s.gauge(d, 3, "y")
	s.gauge(d, 4, "x") // the same label set again: skipped
	close(ch)
	var ok, invalid int
	for m := range ch {
		if err := m.Write(&dto.Metric{}); err != nil {
			invalid++
			continue
		}
		ok++
	}
	if ok != 2 || invalid != 1 {
		t.Errorf("sent %d good and %d invalid metrics, want 2 and 1", ok, invalid)
	}
}
