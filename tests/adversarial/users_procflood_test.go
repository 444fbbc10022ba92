package adversarial

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// sleepers starts n sleeping processes of a user of their own (whom
// Cleanup ends, all of them) and waits until they run.
func sleepers(t *testing.T, n int) {
	t.Helper()
	u := testenv.MakeUser(t, "fs")
	before := countProcs(t)
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do sleep 900 & i=$((i+1)); done; echo spawned; wait`, n)
	p := testenv.StartCmd(t, u.Command(nil, "/bin/sh", "-c", script))
	testenv.Poll(t, 120*time.Second, fmt.Sprintf("%d sleeping processes", n), func() bool {
		return strings.Contains(p.Output(), "spawned") || p.Exited()
	})
	if got := countProcs(t) - before; got < n*9/10 {
		t.Fatalf("%d processes more after starting %d sleepers", got, n)
	}
}

// countProcs is the number of processes in /proc.
func countProcs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if c := e.Name()[0]; c >= '0' && c <= '9' {
			n++
		}
	}
	return n
}

// cpuOver is the daemon's CPU (utime+stime) over f, in cores.
func cpuOver(t *testing.T, pid int, f func()) (float64, time.Duration) {
	t.Helper()
	c0, err := testenv.ProcCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f()
	took := time.Since(start)
	c1, err := testenv.ProcCPU(pid)
	if err != nil {
		t.Fatalf("the daemon is gone: %v", err)
	}
	return (c1 - c0).Seconds() / took.Seconds(), took
}

// TestKernelOnlyEndpointsRefuseCheaply: on a host with 3,000 more
// processes, bob (no kernel) sends POST /api/v1/oom and /api/v1/snapshots
// from 8 threads for 10 s, endpoints only a kernel's own process may use.
// The daemon refuses him from his credentials, reading nothing of /proc:
// each refusal costs it under 2 ms of CPU (an old build read all of /proc
// for each request: tens of ms, more than a core under this flood on a
// larger host), its samples keep their pace (a
// change of alice's GPU memory is in its report within 2 s), and alice's
// kernel's own out-of-memory report is recorded meanwhile.
func TestKernelOnlyEndpointsRefuseCheaply(t *testing.T) {
	t.Parallel()
	r := startFloodRig(t, false)
	sleepers(t, 3000)
	// The daemon's own cost, as a baseline: a window of measure, waiting
	// for nothing.
	idle, _ := cpuOver(t, r.d.PID(), func() { <-time.After(3 * time.Second) })
	// A refusal from the caller's credentials costs the daemon a request's
	// parse and answer (about 0.25 ms here); a read of all of /proc costs
	// tens of ms a request (40 ms on this host of 3,000 processes).
	const maxPerRefusal = 2 * time.Millisecond
	var counts []map[string]int
	var floods []*flood
	cores, took := cpuOver(t, r.d.PID(), func() {
		floods = []*flood{startFlood(t, r.bob, r.sock, "POST", "/api/v1/oom", 4, 10, []byte(`{"framework":"torch","message":"x"}`)),
			startFlood(t, r.bob, r.sock, "POST", "/api/v1/snapshots", 4, 10, []byte(`{"path":"/tmp/x.pickle","reason":"manual"}`))}
		// The samples' pace: alice's kernel's memory changes, and the
		// report has it within 2 s (10 intervals).
		for i, used := range []uint64{3 << 30, 5 << 30} {
			r.gpu.Set(t, testenv.FakeProc{PID: r.ak.Cmd.Process.Pid, UsedBytes: used})
			changed := time.Now()
			ok := testenv.Eventually(2*time.Second, func() bool {
				for _, nb := range r.d.Report(t).Notebooks {
					if nb.KernelID == r.aliceID && nb.GPUMemoryBytes == used {
						return true
					}
				}
				return false
			})
			if !ok {
				t.Errorf("change %d of alice's GPU memory not in the daemon's report %v later: sampling fell behind under bob's flood", i+1, time.Since(changed).Round(time.Millisecond))
			}
		}
		st, body := kernelPost(t, r.aliceFile, "/api/v1/oom", `{"framework":"torch","message":"CUDA out of memory. Tried to allocate 2.00 GiB","requested_bytes":2147483648}`)
		if st != 200 || !strings.Contains(body, r.aliceFile) {
			t.Errorf("alice's kernel's out-of-memory report during bob's flood: %d %.300s", st, body)
		}
		for _, f := range floods {
			counts = append(counts, f.counts(t, 60*time.Second))
		}
	})
	refused := counts[0]["403"] + counts[1]["403"]
	perReq := time.Duration(0)
	if refused > 0 {
		perReq = time.Duration(max(cores-idle, 0) * float64(took) / float64(refused))
	}
	t.Logf("kernel-only endpoints flooded on a host of %d processes: daemon CPU %.3f cores over %v (%.3f idle), %v a refusal; bob's answers: %v (oom), %v (snapshots)",
		countProcs(t), cores, took.Round(time.Millisecond), idle, perReq, counts[0], counts[1])
	if refused < 50 {
		t.Errorf("bob's floods got %v and %v: want at least 50 refusals for the figure to mean anything", counts[0], counts[1])
	}
	if perReq > maxPerRefusal {
		t.Errorf("the daemon spent %v of CPU on each refusal of bob's requests (%.3f cores, %.3f idle): want under %v", perReq, cores, idle, maxPerRefusal)
	}
}
