package adversarial

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestExemptKernelNotCulledThroughAnotherUsersID: alice is exempt from
// culling; bob names a kernel's file of his after her kernel's id. Culling
// knows each kernel by its connection file, so her kernel is judged as
// hers (exempt) and never shut down, whatever bob's kernel of that id
// holds; bob's own idle kernel under his own server is culled as the
// policy says (culling is on).
//
// Built so that an older build fails every time: bob's kernel comes after
// hers is known (each then proven as its own user's), hers holds more, so
// the report lists it first and bob's last, and a policy that looked users
// up by kernel id took bob for its owner.
func TestExemptKernelNotCulledThroughAnotherUsersID(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client")
	kind := testenv.ServerKinds()[0]
	alice, bob := testenv.MakeUser(t, "ca"), testenv.MakeUser(t, "cb")

	hers := testenv.StartServerWith(t, kind, testenv.ServerOptions{As: &alice})
	his := testenv.StartServerWith(t, kind, testenv.ServerOptions{As: &bob})
	sessA := hers.CreateSession(t, "hers.ipynb")
	sessB := his.CreateSession(t, "his.ipynb")
	fileA, fileB := hers.ConnectionFile(sessA.Kernel.ID), his.ConnectionFile(sessB.Kernel.ID)
	for _, f := range []string{fileA, fileB} {
		testenv.WaitKernelListening(t, f, 60*time.Second)
	}
	pidA, pidB := testenv.KernelPIDs(fileA), testenv.KernelPIDs(fileB)
	if len(pidA) != 1 || len(pidB) != 1 {
		t.Fatalf("kernel processes: alice's %v, bob's %v", pidA, pidB)
	}
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: pidA[0], UsedBytes: 4 << 30}, testenv.FakeProc{PID: pidB[0], UsedBytes: 2 << 30})
	d, _ := sharedDaemon(t, gpu, []testenv.User{alice, bob},
		"--cull-idle=2s", "--cull-warn=0s", "--cull-min-memory=0", "--cull-action=shutdown", "--cull-exempt-users="+alice.Name)
	d.WaitLog(t, 60*time.Second, "kernel process", map[string]any{"pid": pidA[0]})

	// Bob's kernel named after hers, in a dir of his, once hers is known.
	trap := bob.StartKernel(t, filepath.Join(bob.Home, "d", "kernel-"+sessA.Kernel.ID+".json"))
	testenv.WaitKernelListening(t, trap.ConnectionFile, 60*time.Second)
	gpu.Set(t, testenv.FakeProc{PID: pidA[0], UsedBytes: 4 << 30}, testenv.FakeProc{PID: pidB[0], UsedBytes: 2 << 30},
		testenv.FakeProc{PID: trap.Cmd.Process.Pid, UsedBytes: 1 << 30})
	d.WaitLog(t, 60*time.Second, "kernel process", map[string]any{"pid": trap.Cmd.Process.Pid})
	// Culling works: bob's idle kernel under his server is shut down.
	d.WaitLog(t, 60*time.Second, "idle kernel holding GPU memory shut down through its server", map[string]any{"kernel_id": sessB.Kernel.ID})

	var cu crossUser
	defer cu.summary(t)
	deadline := time.Now().Add(4 * time.Second)
	culled := false
	for time.Now().Before(deadline) && !culled {
		_, culled = d.FindLog("idle kernel holding GPU memory shut down through its server", map[string]any{"kernel_id": sessA.Kernel.ID})
		culled = culled || !testenv.Alive(pidA[0])
		time.Sleep(100 * time.Millisecond)
	}
	cu.action(t, culled, "alice's exempt kernel was shut down: bob's kernel of her id made her kernel his for culling")
}
