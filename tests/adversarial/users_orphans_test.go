package adversarial

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestOrphansThroughAnotherUsersKernelID: alice's kernel starts a job in a
// session of its own that computes on the GPU; her kernel is shut down
// (killed, its file gone) and reclaim leaves the job running. Bob's live
// kernel is named after her kernel's id (startSameIDKernels). Through that
// id bob's "end what was left running" reaches his own kernel only, and
// naming her connection file is refused: her job runs on. Alice, whose
// kernel is gone from the report, ends it by the same id: the daemon knows
// her as the job's recorded owner.
func TestOrphansThroughAnotherUsersKernelID(t *testing.T) {
	t.Parallel()
	k := startSameIDKernels(t, "--reclaim-grace=1s")
	_, job := spawnChildren(t, k.ak)
	k.gpu.Set(t, testenv.FakeProc{PID: k.bk.Cmd.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: k.ak.Cmd.Process.Pid, UsedBytes: 2 << 30},
		testenv.FakeProc{PID: job, UsedBytes: 20 << 30, SMPercent: 97, MemoryPercent: 30})
	waitRecorded(t, k.d, k.id, job)

	// Alice's kernel shuts down: its process and its file go.
	if err := k.ak.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(k.aliceFile); err != nil {
		t.Fatal(err)
	}
	k.d.WaitLog(t, 30*time.Second, "orphan left running: computing", map[string]any{"pid": job})
	testenv.Poll(t, 10*time.Second, "the report lists alice's job left running", func() bool {
		for _, lr := range k.d.Report(t).LeftRunning {
			if lr.PID == job && lr.ConnectionFile == k.aliceFile && lr.User == k.alice.Name {
				return true
			}
		}
		return false
	})

	var cu crossUser
	defer cu.summary(t)
	path := "/api/v1/kernels/" + k.id + "/orphans/end"
	for i := 0; i < 3; i++ {
		st, body := k.bobAPI(t, "POST", path, "")
		cu.action(t, !testenv.Alive(job), fmt.Sprintf("bob's POST %s (%d %.200s) ended alice's job", path, st, body))
		if st != 404 || namesPID(body, job) {
			t.Errorf("bob's POST %s: %d %.300s, want 404 (his kernel left nothing running) naming nothing of hers", path, st, body)
		}
	}
	q := "?connection_file=" + url.QueryEscape(k.aliceFile)
	st, body := k.bobAPI(t, "POST", path+q, "")
	cu.action(t, !testenv.Alive(job), fmt.Sprintf("bob's POST naming alice's file (%d %.200s) ended her job", st, body))
	if st != 403 {
		t.Errorf("bob's POST naming alice's file: %d %.300s, want 403", st, body)
	}
	staysAlive(t, time.Second, "bob's requests", job)

	st, body = apiAs(t, k.alice, k.sock, "POST", path+q, fmt.Sprintf(`{"pids":[%d]}`, job))
	if st != 200 || !strings.Contains(body, `"ended":true`) {
		t.Fatalf("alice ending her job: %d %.300s", st, body)
	}
	testenv.Poll(t, 10*time.Second, "alice's job ends on her request", func() bool { return !testenv.Alive(job) })
}
