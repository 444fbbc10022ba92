package adversarial

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestWhyAndChildrenThroughAnotherUsersKernelID: bob names his kernel's
// file after alice's kernel id (startSameIDKernels). Through that id bob's
// %gpumem why, its join with the driver's figures and free --children act
// on his own kernel only: he never sees her variables, her processes or
// their commands, and never ends her kernel's worker, even naming her
// connection file; his own worker is ended, and alice ends hers.
func TestWhyAndChildrenThroughAnotherUsersKernelID(t *testing.T) {
	t.Parallel()
	k := startSameIDKernels(t)
	const spawnChild = `import json, subprocess, sys
_p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # worker-of-%s"])
print(json.dumps([_p.pid]))`
	bobChild := cellInts(t, k.bk, fmt.Sprintf(spawnChild, "bob"))[0]
	aliceChild := cellInts(t, k.ak, fmt.Sprintf(spawnChild, "alice"))[0]
	killLater(t, bobChild, aliceChild)
	k.gpu.Set(t, testenv.FakeProc{PID: k.bk.Cmd.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: bobChild, UsedBytes: 1 << 30},
		testenv.FakeProc{PID: k.ak.Cmd.Process.Pid, UsedBytes: 2 << 30}, testenv.FakeProc{PID: aliceChild, UsedBytes: 1 << 30})
	waitRecorded(t, k.d, k.id, bobChild, aliceChild)

	var cu crossUser
	defer cu.summary(t)
	base := "/api/v1/kernels/" + k.id
	// What of alice's kernel a reply must never hold.
	hers := func(body string) bool {
		return strings.Contains(body, "secret_weights") || strings.Contains(body, "worker-of-alice") ||
			namesPID(body, aliceChild) || namesPID(body, k.ak.Cmd.Process.Pid)
	}
	for i := 0; i < 5; i++ {
		status, body := k.bobAPI(t, "GET", base+"/why?all_devices=1", "")
		cu.read(t, hers(body), fmt.Sprintf("bob's GET %s/why (%d) shows alice's kernel: %.300s", base, status, body))
		if status != 200 || !strings.Contains(body, "bobs_own") {
			t.Errorf("bob's GET %s/why: %d without his own variable: %.300s", base, status, body)
		}
		status, body = k.bobAPI(t, "POST", base+"/why", `{"kind":"why","schema":1,"rows":[]}`)
		cu.read(t, hers(body), fmt.Sprintf("bob's POST %s/why (%d) joined alice's driver figures: %.300s", base, status, body))
		if status != 200 || !namesPID(body, bobChild) {
			t.Errorf("bob's POST %s/why: %d without his own worker %d: %.300s", base, status, bobChild, body)
		}
	}
	q := "?connection_file=" + url.QueryEscape(k.aliceFile)
	status, body := k.bobAPI(t, "GET", base+"/why"+q, "")
	cu.read(t, hers(body), fmt.Sprintf("bob's GET why naming alice's file (%d): %.300s", status, body))
	if status != 403 {
		t.Errorf("bob's GET why naming alice's file: %d %.300s, want 403", status, body)
	}

	status, body = k.bobAPI(t, "POST", base+"/children/free"+q, "")
	cu.action(t, !testenv.Alive(aliceChild), fmt.Sprintf("bob's POST children/free naming alice's file (%d %.200s) ended her worker", status, body))
	if status != 403 || hers(body) {
		t.Errorf("bob's POST children/free naming alice's file: %d %.300s, want 403 telling nothing of hers", status, body)
	}
	// The figures before a teardown are the kernel's own cell's to ask for:
	// bob's shell, not in his kernel's tree, is refused, and never reaches hers.
	status, body = k.bobAPI(t, "POST", base+"/children/before"+q, "")
	if status != 403 || hers(body) {
		t.Errorf("bob's POST children/before naming alice's file: %d %.300s, want 403 telling nothing of hers", status, body)
	}
	status, body = k.bobAPI(t, "POST", base+"/children/before", "")
	cu.read(t, hers(body), fmt.Sprintf("bob's POST %s/children/before (%d) names alice's kernel: %.300s", base, status, body))
	if status != 409 {
		t.Errorf("bob's POST %s/children/before from outside his kernel: %d %.300s, want 409", base, status, body)
	}
	for i := 0; i < 3; i++ {
		status, body = k.bobAPI(t, "POST", base+"/children/free", "")
		cu.action(t, !testenv.Alive(aliceChild), fmt.Sprintf("bob's POST %s/children/free (%d %.200s) ended alice's worker", base, status, body))
		cu.read(t, hers(body), fmt.Sprintf("bob's POST %s/children/free (%d) names alice's kernel: %.300s", base, status, body))
		if status != 200 {
			t.Errorf("bob's POST %s/children/free: %d %.300s", base, status, body)
		}
	}
	testenv.Poll(t, 20*time.Second, "bob's worker ends", func() bool { return !testenv.Alive(bobChild) })
	staysAlive(t, 2*time.Second, "bob's free --children", aliceChild, k.ak.Cmd.Process.Pid, k.bk.Cmd.Process.Pid)

	// Alice reaches her own kernel's worker by the same id.
	status, body = apiAs(t, k.alice, k.sock, "POST", base+"/children/free", "")
	if status != 200 {
		t.Errorf("alice's POST %s/children/free: %d %.300s", base, status, body)
	}
	testenv.Poll(t, 20*time.Second, "alice's worker ends", func() bool { return !testenv.Alive(aliceChild) })
	if !testenv.Alive(k.ak.Cmd.Process.Pid) {
		t.Errorf("alice's free --children ended her kernel")
	}
}

// bobAPI is apiAs for bob.
func (k sameIDKernels) bobAPI(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	return apiAs(t, k.bob, k.sock, method, path, body)
}
