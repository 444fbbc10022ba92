package metrics

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpumem/gpumem/sidecar/attribution"
)

func TestPodSeries(t *testing.T) {
	alice := &attribution.Pod{Name: "jupyter-alice", Namespace: "jhub", UID: "u1", Container: "notebook", User: "alice"}
	snap := testSnapshot()
	snap.Report.Notebooks = []attribution.Notebook{
		{KernelID: "k1", Notebook: "/home/jovyan/train.ipynb", PIDs: []int{10}, Pod: alice,
			PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 3 * gib}, {Index: 1, Bytes: gib}}},
		{KernelID: "k2", Notebook: "/home/jovyan/eval.ipynb", PIDs: []int{20}, Pod: alice,
			PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 2 * gib}}},
		// A kernel on the host (no pod) has no pod series.
		{KernelID: "k3", Notebook: "/srv/host.ipynb", PIDs: []int{30},
			PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: gib}}},
	}
	snap.Report.Other = []attribution.OtherProcess{
		// Two processes of one pod outside any kernel: summed.
		{PID: 40, Pod: &attribution.Pod{Name: "trainer-0", Namespace: "ml", Container: "main"}, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: gib}}},
		{PID: 41, Pod: &attribution.Pod{Name: "trainer-0", Namespace: "ml", Container: "main"}, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: 512 << 20}}},
		{PID: 50, PerGPU: []attribution.GPUBytes{{Index: 0, Bytes: gib}}},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(podCollector{src: &fakeSource{snap: snap}, perNotebook: true})
	golden := filepath.Join("testdata", "pods.golden")
	want, err := os.Open(golden)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()
	if err := testutil.GatherAndCompare(reg, want, "gpumem_pod_gpu_memory_bytes"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}

	// Without per-notebook series: one series per pod, container and GPU.
	reg = prometheus.NewRegistry()
	reg.MustRegister(podCollector{src: &fakeSource{snap: snap}})
	perPod := `# HELP gpumem_pod_gpu_memory_bytes GPU memory held by the processes of a Kubernetes pod, in bytes, by container and notebook (notebook is empty for processes of no kernel); user is the JupyterHub user from the pod's labels.
# TYPE gpumem_pod_gpu_memory_bytes gauge
gpumem_pod_gpu_memory_bytes{container="notebook",gpu="0",kernel_id="",namespace="jhub",notebook="",pod="jupyter-alice",user="alice"} 5.36870912e+09
gpumem_pod_gpu_memory_bytes{container="notebook",gpu="1",kernel_id="",namespace="jhub",notebook="",pod="jupyter-alice",user="alice"} 1.073741824e+09
gpumem_pod_gpu_memory_bytes{container="main",gpu="0",kernel_id="",namespace="ml",notebook="",pod="trainer-0",user=""} 1.610612736e+09
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(perPod), "gpumem_pod_gpu_memory_bytes"); err != nil {
		t.Error(err)
	}

	// Off Kubernetes: no series at all.
	reg = prometheus.NewRegistry()
	reg.MustRegister(podCollector{src: &fakeSource{snap: testSnapshot()}})
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("without pods: %d series, %v", n, err)
	}
}
