package kube

// BenchmarkFleet simulates many nodes' daemons on one machine: N real
// `gpumem serve` processes (built without -race), each with its own
// simulated node of 8 GPUs whose 100 GPU processes are real processes of
// this machine, sampling at the default --interval 1s and serving
// /metrics. It measures what a fleet pays per node: the daemon's on-CPU
// time (schedstat) and RSS over a steady window, the size of one scrape
// and its series, and the scrape's latency.
//
// Run (about 2 minutes on a 2-core machine):
//
//	go test ./tests/kube/ -run '^$' -bench Fleet -benchtime 1x -timeout 20m -v
//
// Without -bench, go test builds nothing and runs nothing here.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

const (
	fleetGPUs      = 8
	fleetProcesses = 100
)

func BenchmarkFleet(b *testing.B) {
	dir := b.TempDir()
	bin, err := testenv.GoBuild(dir, "gpumem", "./cmd/gpumem", false)
	if err != nil {
		b.Fatal(err)
	}
	// The GPU processes: real, idle processes, so that every sample finds
	// them in /proc as it would find kernels and their workers.
	var pids []int
	for range fleetProcesses {
		cmd := exec.Command("sleep", "3600")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		pids = append(pids, cmd.Process.Pid)
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
	gpus := make([]testenv.SimGPU, fleetGPUs)
	for g := range gpus {
		gpus[g] = testenv.SimGPU{Name: "Simulated H200", UUID: fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", g), MemoryTotalBytes: 141 << 30}
	}
	for i, pid := range pids {
		g := &gpus[i%fleetGPUs]
		g.Processes = append(g.Processes, testenv.FakeProc{PID: pid, UsedBytes: uint64(i%7+1) << 28})
	}
	gpuFile := filepath.Join(dir, "gpus.json")
	testenv.WriteSimulatedGPUs(b, gpuFile, gpus...)

	for _, n := range []int{1, 10, 30} {
		b.Run(fmt.Sprintf("daemons=%d", n), func(b *testing.B) {
			for range b.N {
				runFleet(b, bin, gpuFile, n)
			}
		})
	}
}

type fleetDaemon struct {
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
}

func runFleet(b *testing.B, bin, gpuFile string, n int) {
	daemons := make([]*fleetDaemon, n)
	for i := range daemons {
		dir := b.TempDir()
		port := testenv.FreePort(b)
		cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:"+strconv.Itoa(port),
			"--socket", filepath.Join(dir, "gpumem.sock"), "--log-format", "json", "--no-inject")
		cmd.Env = append(testenv.Env(dir), "GPUMEM_FAKE_GPU="+gpuFile)
		logs := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = io.Discard, logs
		if err := os.MkdirAll(filepath.Join(dir, "runtime"), 0o700); err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		d := &fleetDaemon{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), logs: logs}
		daemons[i] = d
		b.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	}
	// Ready: every daemon has sampled (its /metrics names all GPUs).
	client := &http.Client{Timeout: 10 * time.Second}
	for _, d := range daemons {
		deadline := time.Now().Add(60 * time.Second)
		for {
			body, _, err := scrape(client, d.url)
			if err == nil && strings.Count(string(body), "gpumem_gpu_memory_total_bytes{") == fleetGPUs {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("no sample at %s after 60s: %v\n%s\ndaemon log:\n%s", d.url, err, body, d.logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	time.Sleep(3 * time.Second) // settle after start-up (a benchmark, not a test)

	const window = 20 * time.Second
	load0 := testenv.LoadAverage()
	run0 := make([]time.Duration, n)
	for i, d := range daemons {
		r, err := testenv.ProcRunTime(d.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		run0[i] = r
	}
	start := time.Now()
	for time.Since(start) < window {
		time.Sleep(250 * time.Millisecond)
	}
	wall := time.Since(start)
	var cpu, rss float64
	for i, d := range daemons {
		r, err := testenv.ProcRunTime(d.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		cpu += 100 * (r - run0[i]).Seconds() / wall.Seconds()
		m, _, err := testenv.ProcMemory(d.cmd.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		rss += float64(m) / (1 << 20)
	}
	// Scrape each once, as Prometheus would.
	var bytesSum, seriesSum, ourSum int
	var scrapeSum time.Duration
	for _, d := range daemons {
		body, took, err := scrape(client, d.url)
		if err != nil {
			b.Fatal(err)
		}
		all, ours := countSeries(body)
		bytesSum += len(body)
		seriesSum += all
		ourSum += ours
		scrapeSum += took
	}
	nf := float64(n)
	b.ReportMetric(cpu/nf, "schedstat-cpu-%core/daemon")
	b.ReportMetric(cpu, "schedstat-cpu-%core/all")
	b.ReportMetric(rss/nf, "rss-MiB/daemon")
	b.ReportMetric(float64(bytesSum)/nf, "scrape-bytes/daemon")
	b.ReportMetric(float64(seriesSum)/nf, "series/daemon")
	b.ReportMetric(float64(ourSum)/nf, "gpumem-series/daemon")
	b.ReportMetric(float64(scrapeSum.Microseconds())/nf/1000, "scrape-ms/daemon")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d daemons, %d GPUs and %d GPU processes each; %v window; load average %.2f → %.2f",
		n, fleetGPUs, fleetProcesses, wall.Round(time.Millisecond), load0, testenv.LoadAverage())
}

func scrape(client *http.Client, url string) ([]byte, time.Duration, error) {
	start := time.Now()
	resp, err := client.Get(url)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return body, time.Since(start), nil
}

// countSeries counts the sample lines of a text exposition, and those of
// gpumem's own families.
func countSeries(body []byte) (all, ours int) {
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		all++
		if strings.HasPrefix(line, "gpumem_") {
			ours++
		}
	}
	return all, ours
}
