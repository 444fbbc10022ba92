package serve

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// ppidOf is pid's parent now (0 when gone).
func ppidOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// TestServeKeepsTreesBetweenFullReads: the daemon reads /proc in full only
// now and then, and learns of a kernel's new processes in between; none is
// lost. A child that a kernel starts in a session of its own, through a
// shell that leaves a few seconds later (so that it is on no kernel's tree
// by the time it holds GPU memory), and a `nohup … &` job (init's child in
// the kernel's session, another process group) are each the kernel's: when the kernel restarts,
// both are ended. A process of no kernel holding GPU memory is not.
func TestServeKeepsTreesBetweenFullReads(t *testing.T) {
	testenv.Require(t, "notebook", "ipykernel")
	srv := testenv.StartServer(t, testenv.NotebookServer())
	gpu := testenv.NewFakeGPU(t)
	d := startDaemon(t, srv, gpu, "--interval=1s")
	nb := openNotebook(t, srv, "work/trees.ipynb")
	nb.waitMagic(t, 10*time.Second)
	reap := testenv.NewReaper(t, nil)

	leaver := nb.intCell(t, "import subprocess\n"+
		"_sh = subprocess.Popen(['sh', '-c', 'setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $!; sleep 3'], stdout=subprocess.PIPE, text=True)\n"+
		"print(_sh.stdout.readline())")
	reap.Add(leaver)
	// A `nohup … &` job started from a process group of its own (as a
	// shell's job control does): init's child, in the kernel's session but
	// not in its process group, so Jupyter's kill of that group at the
	// restart does not reach it; only gpumem's reclaim can.
	nohup := nb.intCell(t, "import subprocess\n"+
		"_j = subprocess.Popen(['sh', '-c', 'nohup sleep 600 >/dev/null 2>&1 & echo $!'], stdout=subprocess.PIPE, text=True, process_group=0)\n"+
		"_p = _j.stdout.readline().strip(); _j.wait(); print(_p)")
	reap.Add(nohup)
	other := startUnrelated(t)
	// The shell leaves: the child is init's (or a subreaper's) now, in a
	// session of its own, on no kernel's tree.
	testenv.Poll(t, 10*time.Second, "the setsid child's shell to exit", func() bool {
		p := ppidOf(leaver)
		return p != 0 && p != nb.pid && ppidOf(p) != nb.pid
	})
	gpu.Set(t, testenv.FakeProc{PID: nb.pid, UsedBytes: 600 << 20}, testenv.FakeProc{PID: leaver, UsedBytes: 2 << 30},
		testenv.FakeProc{PID: nohup, UsedBytes: 3 << 30}, testenv.FakeProc{PID: other.Process.Pid, UsedBytes: 4 << 30})
	waitNotebookHas(t, d, nb.sess.Kernel.ID, nohup)

	srv.JSON(t, http.MethodPost, "api/kernels/"+nb.sess.Kernel.ID+"/restart", nil, nil)
	for _, pid := range []int{leaver, nohup} {
		testenv.Poll(t, 10*time.Second, "the kernel's process "+strconv.Itoa(pid)+" ended", func() bool { return !testenv.Alive(pid) })
		// Logged before the signal, read from stderr maybe after the exit.
		d.WaitLog(t, 5*time.Second, "ending orphan that holds GPU memory (SIGTERM)", map[string]any{"pid": pid, "after": "restart"})
	}
	if !testenv.Alive(other.Process.Pid) {
		t.Fatalf("the process of no kernel (%d) was ended", other.Process.Pid)
	}
}
