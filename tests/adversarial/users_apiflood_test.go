package adversarial

// Floods of the shared daemon's socket by one user (bob): what they may
// cost the root daemon (memory, log, CPU) is bounded, and another user's
// kernel (alice's) is still answered while they run.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// floodRig is a shared root daemon (at info, the level users run) serving
// alice, who has a kernel with the magics, and bob, with one too when
// asked.
type floodRig struct {
	alice, bob         testenv.User
	aliceID, bobID     string
	aliceFile, bobFile string
	ak                 *testenv.Kernel
	gpu                *testenv.FakeGPU
	d                  *testenv.Daemon
	sock               string
}

func startFloodRig(t *testing.T, bobKernel bool) *floodRig {
	t.Helper()
	testenv.Require(t, "ipykernel", "jupyter_client")
	testenv.RequireRoot(t, "the shared-host scenarios run a root daemon for real test accounts")
	r := &floodRig{alice: testenv.MakeUser(t, "fa"), bob: testenv.MakeUser(t, "fb"), aliceID: testenv.NewKernelID(), gpu: testenv.NewFakeGPU(t)}
	r.aliceFile = filepath.Join(r.alice.RuntimeDir(), "kernel-"+r.aliceID+".json")
	r.ak = r.alice.StartKernel(t, r.aliceFile)
	procs := []testenv.FakeProc{{PID: r.ak.Cmd.Process.Pid, UsedBytes: 1 << 30}}
	ids := []string{r.aliceID}
	if bobKernel {
		r.bobID = testenv.NewKernelID()
		r.bobFile = filepath.Join(r.bob.RuntimeDir(), "kernel-"+r.bobID+".json")
		bk := r.bob.StartKernel(t, r.bobFile)
		procs = append(procs, testenv.FakeProc{PID: bk.Cmd.Process.Pid, UsedBytes: 1 << 30})
		ids = append(ids, r.bobID)
	}
	r.gpu.Set(t, procs...)
	sockDir, err := os.MkdirTemp("", "gpumem-flood-")
	if err == nil {
		err = os.Chmod(sockDir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	r.sock = filepath.Join(sockDir, "gpumem.sock")
	r.d = testenv.StartDaemonWith(t, gpumemBin, jupyterDir(t), r.gpu, testenv.DaemonOptions{LogLevel: "info"},
		"--all-users", "--reclaim-all-users", "--socket="+r.sock, "--socket-mode=shared", "--interval=200ms", "--rescan=500ms",
		"--users="+r.alice.Name, "--users="+r.bob.Name)
	for _, id := range ids {
		r.d.WaitLog(t, 90*time.Second, "magics injected", map[string]any{"kernel_id": id})
	}
	return r
}

// flooderPy sends one request over and over from THREADS threads until
// SECONDS have passed, STOPFILE exists or the daemon is gone, then prints
// the count of each status ("reset": the daemon closed the connection
// before answering, as it does after a 413). It prints "flooding" once the
// first answer is in.
const flooderPy = `
import json, os, socket, sys, threading, time
sock, method, path, threads, seconds, bodyfile, stopfile = sys.argv[1:8]
body = open(bodyfile, "rb").read() if bodyfile != "-" else b""
req = ("%s %s HTTP/1.1\r\nHost: local-gpumem.sock\r\nContent-Type: application/json\r\n"
       "Content-Length: %d\r\nConnection: close\r\n\r\n" % (method, path, len(body))).encode() + body
end = time.monotonic() + float(seconds)
counts, lock, first = {}, threading.Lock(), threading.Event()
def add(k):
    with lock:
        counts[k] = counts.get(k, 0) + 1
    first.set()
def run():
    while time.monotonic() < end and not os.path.exists(stopfile):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        try:
            s.connect(sock)
        except OSError:
            add("down")
            return
        try:
            try:
                s.sendall(req)
            except OSError:
                pass
            head = s.recv(64)
            add(head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "noreply")
        except OSError:
            add("reset")
        finally:
            s.close()
ts = [threading.Thread(target=run, daemon=True) for _ in range(int(threads))]
for t in ts:
    t.start()
first.wait(float(seconds))
print("flooding", flush=True)
for t in ts:
    t.join()
print(json.dumps(counts), flush=True)
`

// flood is a running flooderPy.
type flood struct {
	p        *testenv.Proc
	stopFile string
}

// startFlood runs flooderPy as u and waits for its first answer; body is
// "" for none.
func startFlood(t *testing.T, u testenv.User, sock, method, path string, threads int, seconds float64, body []byte) *flood {
	t.Helper()
	dir := u.Home
	bodyFile := "-"
	if body != nil {
		bodyFile = filepath.Join(dir, "body-"+testenv.RandomHex(4)+".json")
		if err := os.WriteFile(bodyFile, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f := &flood{stopFile: filepath.Join(dir, "stop-"+testenv.RandomHex(4))}
	f.p = testenv.StartCmd(t, u.Command(nil, "/usr/bin/python3", "-c", flooderPy, sock, method, path, itoa(threads),
		fmt.Sprint(seconds), bodyFile, f.stopFile))
	testenv.Poll(t, 30*time.Second, "bob's flood to answer", func() bool {
		return strings.Contains(f.p.Output(), "flooding") || f.p.Exited()
	})
	return f
}

// stop asks the flood to end (each thread ends after its request).
func (f *flood) stop(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(f.stopFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// counts waits (timeout) for the flood's end and returns its counts.
func (f *flood) counts(t *testing.T, timeout time.Duration) map[string]int {
	t.Helper()
	testenv.Poll(t, timeout, "the flood to end", f.p.Exited)
	out := f.p.Output()
	var c map[string]int
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if json.Unmarshal([]byte(lines[len(lines)-1]), &c) != nil {
		t.Fatalf("the flood printed %q", out)
	}
	return c
}

// whyRows is a POST .../why body of size bytes at most: why data whose
// rows are the smallest objects (a generic decode costs the most per byte
// of those).
func whyRows(size int) []byte {
	var b strings.Builder
	b.WriteString(`{"kind":"why","schema":1,"rows":[{"a":1}`)
	for b.Len()+len(`,{"a":1}]}`) <= size {
		b.WriteString(`,{"a":1}`)
	}
	b.WriteString("]}")
	return []byte(b.String())
}

// TestWhyFloodBoundsDaemonMemory: bob, with one kernel, posts why data for
// it from 16 threads at once, half with bodies just under the 4 MiB an
// old build took and half under today's bound, for 10 s. The root
// daemon's resident memory stays under 256 MiB, and alice's kernel is
// answered meanwhile: her free, and her kernel's own why join.
func TestWhyFloodBoundsDaemonMemory(t *testing.T) {
	t.Parallel()
	r := startFloodRig(t, true)
	rss0, _, err := testenv.ProcMemory(r.d.PID())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	w := watchRSS(t, r.d)
	path := "/api/v1/kernels/" + r.bobID + "/why"
	floods := []*flood{startFlood(t, r.bob, r.sock, "POST", path, 8, 10, whyRows(4<<20-1024)),
		startFlood(t, r.bob, r.sock, "POST", path, 8, 10, whyRows(255<<10))}
	// Alice's kernel meanwhile (unless the guard had to kill the daemon).
	if !r.d.Exited() {
		out, errOut, err := r.alice.Run(nil, "curl", "-sS", "--max-time", "40", "--unix-socket", r.sock, "-o", "/dev/null", "-w", "%{http_code}",
			"-X", "POST", "http://local-gpumem.sock/api/v1/kernels/"+r.aliceID+"/free")
		if err != nil || out != "200" {
			t.Errorf("alice's free during bob's flood: %s %v %s", out, err, errOut)
		}
	}
	if !r.d.Exited() {
		st, body := kernelPost(t, r.aliceFile, "/api/v1/kernels/"+r.aliceID+"/why", `{"kind":"why","schema":1,"rows":[]}`)
		if st != 200 || !strings.Contains(body, `"driver"`) {
			t.Errorf("alice's kernel's why join during bob's flood: %d %.300s", st, body)
		}
	}
	var counts []map[string]int
	for _, f := range floods {
		counts = append(counts, f.counts(t, 60*time.Second))
	}
	t.Logf("why flood: daemon RSS %.1f MiB before, %v of floods; bob's answers: %v (4 MiB bodies), %v (255 KiB bodies)",
		float64(rss0)/(1<<20), time.Since(start).Round(time.Millisecond), counts[0], counts[1])
	w.check(t, r.d, "bob's why flood")
}

// TestRefusalFloodBoundsDaemonLog: bob (no kernel) asks for a kernel of a
// 60 KB id from 4 threads for 10 s, each request refused (403). The
// daemon's log grows by less than 1 MiB a minute, and one line of it says
// that bob's refusals are counted rather than logged.
func TestRefusalFloodBoundsDaemonLog(t *testing.T) {
	t.Parallel()
	r := startFloodRig(t, false)
	const seconds = 10
	const bound = (1 << 20) * seconds / 60 // 1 MiB a minute
	before := len(r.d.Output())
	start := time.Now()
	f := startFlood(t, r.bob, r.sock, "GET", "/api/v1/kernels/"+strings.Repeat("x", 60000), 4, seconds, nil)
	// An old build writes hundreds of MiB: stop it at four times the bound.
	testenv.Eventually(seconds*time.Second, func() bool { return len(r.d.Output())-before > 4*bound || f.p.Exited() })
	f.stop(t)
	counts := f.counts(t, 60*time.Second)
	grown, took := len(r.d.Output())-before, time.Since(start)
	perMin := float64(grown) / took.Minutes()
	t.Logf("403 flood: the daemon's log grew %d bytes in %v (%.1f KiB a minute); bob's answers: %v", grown, took.Round(time.Millisecond), perMin/1024, counts)
	if grown <= bound && counts["403"] < 20 {
		t.Errorf("bob's flood got %v: want at least 20 refusals for the figure to mean anything", counts)
	}
	if grown > bound || perMin > 1<<20 {
		t.Errorf("the daemon's log grew %d bytes in %v under bob's refusals (%.1f KiB a minute): want under 1 MiB a minute", grown, took, perMin/1024)
	}
	const counted = "this uid's refused or failed API requests are counted, not logged, until the end of this minute"
	if len(r.d.Logs(counted, map[string]any{"uid": r.bob.UID})) == 0 {
		t.Errorf("no line of the daemon's log says that uid %d's refusals were counted, not logged", r.bob.UID)
	}
}
