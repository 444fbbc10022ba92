package adversarial

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// cullRig is a notebook on a real server whose kernel holds 2 GiB on the
// simulated GPU, with a frontend of its own (the user's notebook), and
// gpumem serve culling it after 3 s idle and a 1 s warning.
type cullRig struct {
	srv   *testenv.Server
	id    string // kernel id
	conn  string // connection file
	pid   int
	front *testenv.Frontend
	d     *testenv.Daemon
}

// startCullRig starts it all with --cull-action=action (and flags, which
// override the rig's) and waits until the
// daemon has injected its magics into the kernel and sees it idle.
func startCullRig(t *testing.T, action string, flags ...string) *cullRig {
	t.Helper()
	testenv.Require(t, "ipykernel", "jupyter_client")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	sess := srv.CreateSession(t, "cull/long.ipynb")
	r := &cullRig{srv: srv, id: sess.Kernel.ID, conn: srv.ConnectionFile(sess.Kernel.ID)}
	r.front = testenv.StartFrontend(t, &testenv.Kernel{Dir: srv.Dir, ConnectionFile: r.conn, ID: r.id})
	out := r.front.Cell(t, "import os; print(os.getpid())").Text()
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("the kernel's pid: %q", out)
	}
	r.pid = pid
	reap.Add(pid)
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: pid, UsedBytes: 2 << 30})
	r.d = testenv.StartDaemon(t, gpumemBin, srv.Dir, gpu, append([]string{"--interval=200ms", "--rescan=300ms",
		"--cull-idle=3s", "--cull-warn=1s", "--cull-min-memory=1GiB", "--cull-action=" + action}, flags...)...)
	r.d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": r.id})
	// The injection is a request like any other: the kernel says idle only
	// after its reply, through ipykernel's IOPub thread, which a loaded host
	// can hold back for a while. A test that stopped the kernel between the
	// two left it busy for good, in the server's eyes and the daemon's, and
	// never warned; and a report saying idle may rest on a reading taken
	// before the injection. A cell of this frontend's own, queued behind the
	// injection, returns only once the kernel said idle for it: nothing is
	// left to publish. Then the daemon's report must say idle too.
	r.front.Cell(t, "pass")
	state := ""
	testenv.Poll(t, 30*time.Second, "the daemon to see the kernel idle after the injection", func() bool {
		for _, nb := range r.d.Report(t).Notebooks {
			if nb.KernelID == r.id && nb.Activity != nil {
				state = nb.Activity.ExecutionState
			}
		}
		return state == "idle"
	})
	return r
}

// listed reports whether the server still runs the kernel.
func (r *cullRig) listed(t *testing.T) bool {
	t.Helper()
	var ks []struct {
		ID string `json:"id"`
	}
	r.srv.JSON(t, http.MethodGet, "api/kernels", nil, &ks)
	for _, k := range ks {
		if k.ID == r.id {
			return true
		}
	}
	return false
}
