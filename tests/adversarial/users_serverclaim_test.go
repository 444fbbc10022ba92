package adversarial

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestServerFileClaimsAnotherUsersKernel: bob runs a server of his own and
// writes its jpserver file, whose sessions list alice's kernel (her id is
// public) as idle since 2001 under a notebook path of his choosing, beside
// his own kernel. A server speaks only for the kernels of its own runtime
// dir whose files belong to its file's owner: alice's kernel keeps its
// name, is never warned or culled on bob's word, and no free runs in it;
// bob's own kernel is named and culled as his server says.
func TestServerFileClaimsAnotherUsersKernel(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client")
	alice, bob := testenv.MakeUser(t, "sa"), testenv.MakeUser(t, "sb")
	idA, idB := testenv.RandomHex(8)+"-a", testenv.RandomHex(8)+"-b"
	aliceFile := filepath.Join(alice.RuntimeDir(), "kernel-"+idA+".json")
	ak := alice.StartKernel(t, aliceFile, "JPY_SESSION_NAME="+filepath.Join(alice.Home, "hers.ipynb"))
	bobFile := filepath.Join(bob.RuntimeDir(), "kernel-"+idB+".json")
	bk := bob.StartKernel(t, bobFile)
	for _, f := range []string{aliceFile, bobFile} {
		testenv.WaitKernelListening(t, f, 60*time.Second)
	}

	type kernel struct {
		ID             string `json:"id"`
		ExecutionState string `json:"execution_state"`
		LastActivity   string `json:"last_activity"`
	}
	type session struct {
		ID     string `json:"id"`
		Path   string `json:"path"`
		Kernel kernel `json:"kernel"`
	}
	sessions, _ := json.Marshal([]session{
		{ID: "s1", Path: "stolen/trap.ipynb", Kernel: kernel{idA, "idle", "2001-01-01T00:00:00Z"}},
		{ID: "s2", Path: "own.ipynb", Kernel: kernel{idB, "idle", "2001-01-01T00:00:00Z"}},
	})
	srv := startFakeServer(t, bob, string(sessions), "")
	writeServerFile(t, bob, bob.RuntimeDir(), map[string]any{
		"url": "http://127.0.0.1:" + itoa(srv.Port) + "/", "token": "bobs-token", "root_dir": filepath.Join(bob.Home, "x"),
		"pid": bk.Cmd.Process.Pid, "version": "2.0.0",
	})

	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: ak.Cmd.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: bk.Cmd.Process.Pid, UsedBytes: 1 << 30})
	d, _ := sharedDaemon(t, gpu, []testenv.User{alice, bob},
		"--cull-idle=1s", "--cull-warn=0s", "--cull-min-memory=0", "--cull-action=free")
	for _, id := range []string{idA, idB} {
		d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": id})
	}
	// Bob's server names and culls his own kernel: the sessions are read.
	d.WaitLog(t, 30*time.Second, "idle kernel's GPU caches freed", map[string]any{"kernel_id": idB})

	var renamed, activity string
	var warned, freed bool
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, nb := range d.Report(t).Notebooks {
			switch nb.KernelID {
			case idA:
				if strings.Contains(nb.Notebook, "trap.ipynb") {
					renamed = nb.Notebook
				}
				if nb.Activity != nil {
					activity = nb.Activity.LastActivity.String()
				}
			case idB:
				if nb.Notebook != filepath.Join(bob.Home, "x", "own.ipynb") {
					t.Errorf("bob's own kernel: notebook %q, want his server's", nb.Notebook)
				}
			}
		}
		_, w := d.FindLog("idle kernel holds GPU memory: warned", map[string]any{"kernel_id": idA})
		_, f := d.FindLog("idle kernel's GPU caches freed", map[string]any{"kernel_id": idA})
		warned, freed = warned || w, freed || f
		time.Sleep(200 * time.Millisecond)
	}
	var cu crossUser
	defer cu.summary(t)
	cu.read(t, renamed != "", "bob's server renamed alice's kernel: "+renamed)
	cu.read(t, activity != "", "bob's server set alice's kernel's last activity: "+activity)
	cu.action(t, warned, "alice's kernel was warned as idle on bob's server's word")
	cu.action(t, freed, "a free ran in alice's kernel on bob's server's word")
}
