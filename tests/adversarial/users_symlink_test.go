package adversarial

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestConnectionFileLinkedToAnotherUsersFile: bob cannot read alice's
// connection file, but he can point a file in his own dir at it, and the
// root daemon could read what he cannot. In bob's watched dir: a symlink to
// alice's file under an id of his choosing, another named after his own
// kernel (so that his id names it), and a hard link to her file (what
// fs.protected_hardlinks=0 lets any user make; made here by root). The
// daemon follows none: no link is opened, a file in bob's dir must be
// bob's, and so it never attaches to alice's kernel through them, and bob
// reaches nothing of hers by those ids.
func TestConnectionFileLinkedToAnotherUsersFile(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client", "torch")
	alice, bob := testenv.MakeUser(t, "la"), testenv.MakeUser(t, "lb")
	newID := func() string { return testenv.RandomHex(8) + "-" + testenv.RandomHex(4) }
	idA, idB, idL, idH := newID(), newID(), newID(), newID()

	aliceFile := filepath.Join(alice.RuntimeDir(), "kernel-"+idA+".json")
	ak := alice.StartKernel(t, aliceFile)
	testenv.WaitKernelListening(t, aliceFile, 60*time.Second)
	testenv.RunCell(t, aliceFile, "import torch; secret_weights = torch.ones(64)", 60*time.Second)

	bobFile := filepath.Join(bob.Home, "real", "kernel-"+idB+".json")
	bk := bob.StartKernel(t, bobFile)
	testenv.WaitKernelListening(t, bobFile, 60*time.Second)
	testenv.RunCell(t, bobFile, "import torch; bobs_own = torch.zeros(8)", 60*time.Second)

	// Bob's dir of links, watched because a process of his names a file
	// there as a kernel's.
	links := filepath.Join(bob.Home, "d2")
	bob.Mkdir(t, links)
	testenv.StartCmd(t, bob.Command(nil, "/usr/bin/python3", "-c", "import time; time.sleep(3600)", "-f", filepath.Join(links, "kernel-"+idL+".json")))
	symL, symB, hard := filepath.Join(links, "kernel-"+idL+".json"), filepath.Join(links, "kernel-"+idB+".json"), filepath.Join(links, "kernel-"+idH+".json")
	for _, l := range []string{symL, symB} {
		if _, stderr, err := bob.Run(nil, "ln", "-s", aliceFile, l); err != nil {
			t.Fatalf("ln -s as bob: %v: %s", err, stderr)
		}
	}
	if err := os.Link(aliceFile, hard); err != nil {
		t.Fatal(err)
	}

	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: ak.Cmd.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: bk.Cmd.Process.Pid, UsedBytes: 2 << 30})
	d, sock := sharedDaemon(t, gpu, []testenv.User{alice, bob})
	for _, id := range []string{idA, idB} {
		d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": id})
	}

	// Through the links, the daemon never attaches to alice's kernel.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		for _, id := range []string{idL, idH} {
			if _, ok := d.FindLog("attached", map[string]any{"kernel_id": id}); ok {
				t.Fatalf("the daemon attached to a kernel through bob's link kernel-%s.json", id)
			}
		}
		if n := len(d.Logs("attached", map[string]any{"kernel_id": idB})); n > 1 {
			t.Fatalf("the daemon attached %d times under bob's id %s: once through his link to alice's file", n, idB)
		}
		for _, nb := range d.Report(t).Notebooks {
			for _, pid := range nb.PIDs {
				if pid == ak.Cmd.Process.Pid && nb.KernelID != idA {
					t.Fatalf("alice's kernel process %d is listed under kernel %s (%s)", pid, nb.KernelID, nb.ConnectionFile)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{"kernel-" + idL + ".json: a symbolic link, not followed", "kernel-" + idB + ".json: a symbolic link, not followed",
		fmt.Sprintf("kernel-%s.json belongs to uid %d, but its dir to uid %d", idH, alice.UID, bob.UID)} {
		if !strings.Contains(d.Output(), want) {
			t.Errorf("the daemon's log does not say %q", want)
		}
	}

	var cu crossUser
	defer cu.summary(t)
	for _, id := range []string{idL, idB, idH} {
		for i := 0; i < 5; i++ {
			status, body := apiAs(t, bob, sock, "GET", "/api/v1/kernels/"+id+"/vars?all_devices=1", "")
			cu.read(t, strings.Contains(body, "secret_weights"), fmt.Sprintf("bob's GET vars of %s (%d): %.300s", id, status, body))
		}
		for i := 0; i < 3; i++ {
			status, body := apiAs(t, bob, sock, "POST", "/api/v1/kernels/"+id+"/free", `{"vars":["secret_weights"]}`)
			cu.action(t, !hasVar(t, aliceFile, "secret_weights"), fmt.Sprintf("bob's POST free of %s (%d %.200s) deleted alice's variable", id, status, body))
		}
	}
	// Bob's own kernel is his.
	if status, body := apiAs(t, bob, sock, "GET", "/api/v1/kernels/"+idB+"/vars?all_devices=1", ""); status != 200 || !strings.Contains(body, "bobs_own") {
		t.Errorf("bob's GET vars of his own kernel: %d %.300s", status, body)
	}
}
