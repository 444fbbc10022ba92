package adversarial

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestKernelNamedAfterAnotherUsersKernel: a kernel id is public (argv,
// /metrics), so bob names his own kernel's file after alice's kernel id.
// The daemon knows each kernel by its connection file and proven process:
// bob reaches his own kernel by that id, never hers. He cannot read her
// variables (GET …/vars), delete them (POST …/free {"vars": …}), or learn
// her names from a refusal; alice still reaches hers; an admin is told the
// id is ambiguous and shown both files. Built to fail an older build every
// time (startSameIDKernels).
func TestKernelNamedAfterAnotherUsersKernel(t *testing.T) {
	t.Parallel()
	k := startSameIDKernels(t)
	id, alice, bob, aliceFile, bobFile, ak, sock := k.id, k.alice, k.bob, k.aliceFile, k.bobFile, k.ak, k.sock

	var cu crossUser
	defer cu.summary(t)
	base := "/api/v1/kernels/" + id
	for i := 0; i < 20; i++ {
		status, body := apiAs(t, bob, sock, "GET", base+"/vars?all_devices=1", "")
		cu.read(t, strings.Contains(body, "secret_weights"), fmt.Sprintf("bob's GET %s/vars (%d) listed alice's secret_weights: %.300s", base, status, body))
		if status == 200 && !strings.Contains(body, "bobs_own") {
			t.Errorf("bob's GET %s/vars: 200 without his own variable: %.300s", base, body)
		}
	}
	// Naming her file does not help.
	q := "?all_devices=1&connection_file=" + url.QueryEscape(aliceFile)
	for i := 0; i < 5; i++ {
		status, body := apiAs(t, bob, sock, "GET", base+"/vars"+q, "")
		cu.read(t, strings.Contains(body, "secret_weights"), fmt.Sprintf("bob's GET vars naming alice's file (%d): %.300s", status, body))
		if status == 200 {
			t.Errorf("bob's GET vars naming alice's file: 200 %.300s", body)
		}
	}
	status, body := apiAs(t, bob, sock, "GET", base, "")
	cu.read(t, strings.Contains(body, aliceFile) || strings.Contains(body, fmt.Sprintf("%d", ak.Cmd.Process.Pid)),
		fmt.Sprintf("bob's GET %s (%d) shows alice's kernel: %.300s", base, status, body))

	// Deleting her variable, by id and by her file; a probe for a name
	// tells bob nothing of her kernel.
	for i := 0; i < 10; i++ {
		status, body := apiAs(t, bob, sock, "POST", base+"/free", `{"vars":["secret_weights"]}`)
		cu.action(t, !hasVar(t, aliceFile, "secret_weights"), fmt.Sprintf("bob's POST %s/free {vars:[secret_weights]} (%d %.200s) deleted alice's variable", base, status, body))
	}
	status, body = apiAs(t, bob, sock, "POST", base+"/free?connection_file="+url.QueryEscape(aliceFile), `{"vars":["secret_weights"]}`)
	if status != 403 || strings.Contains(body, "no variable") {
		t.Errorf("bob's free naming alice's file: %d %q, want 403 telling nothing of her variables", status, body)
	}
	cu.action(t, !hasVar(t, aliceFile, "secret_weights"), "bob's POST free naming alice's file deleted her variable")

	// Bob's own kernel by that id is his to use.
	status, body = apiAs(t, bob, sock, "POST", base+"/free", `{"vars":["bobs_own"]}`)
	if status != 200 || hasVar(t, bobFile, "bobs_own") {
		t.Errorf("bob freeing his own variable: %d %.300s; still there: %v", status, body, hasVar(t, bobFile, "bobs_own"))
	}
	// Alice reaches hers.
	status, body = apiAs(t, alice, sock, "GET", base+"/vars?all_devices=1", "")
	if status != 200 || !strings.Contains(body, "secret_weights") {
		t.Errorf("alice's GET of her own vars: %d %.300s", status, body)
	}
	// An admin is told the id names two kernels, and which.
	status, body = apiAs(t, testenv.User{Name: "root", Home: "/root"}, sock, "GET", base, "")
	var e struct{ Error string }
	_ = json.Unmarshal([]byte(body), &e)
	if status != 409 || !strings.Contains(e.Error, aliceFile) || !strings.Contains(e.Error, bobFile) {
		t.Errorf("root's GET %s: %d %q, want 409 naming both files", base, status, body)
	}
}

// sameIDKernels are bob's kernel, its file named after the id of alice's,
// with a daemon in shared mode following both: bob's kernel holds
// bobs_own, alice's secret_weights (torch tensors).
type sameIDKernels struct {
	id                 string
	alice, bob         testenv.User
	aliceFile, bobFile string
	ak, bk             *testenv.Kernel
	gpu                *testenv.FakeGPU
	d                  *testenv.Daemon
	sock               string
}

// startSameIDKernels starts them so that an older build errs every time,
// not by the luck of map order: alice's connection file is there when the
// daemon starts but her kernel listens only afterwards, so a daemon that
// knew processes by file name gave her file bob's proven process (hence
// bob as its owner) and then, by id, handed bob whichever of the two
// clients it met first. It returns once the magics are in both.
// daemonArgs are added to the daemon's.
func startSameIDKernels(t *testing.T, daemonArgs ...string) sameIDKernels {
	t.Helper()
	testenv.Require(t, "ipykernel", "jupyter_client", "torch")
	alice, bob := testenv.MakeUser(t, "ka"), testenv.MakeUser(t, "kb")
	id := testenv.NewKernelID()

	// Bob's kernel, running first, its file named after alice's id.
	bobFile := filepath.Join(bob.Home, "d", "kernel-"+id+".json")
	bk := bob.StartKernel(t, bobFile)
	testenv.WaitKernelListening(t, bobFile, 60*time.Second)
	testenv.RunCell(t, bobFile, "import torch; bobs_own = torch.zeros(8)", 60*time.Second)

	// Alice's connection file, in her runtime dir, before her kernel runs.
	// Its ports are below the ephemeral range: the daemon dials them until
	// she listens, and a dial to a free ephemeral port can connect to
	// itself and take the port.
	aliceFile := filepath.Join(alice.RuntimeDir(), "kernel-"+id+".json")
	alice.Mkdir(t, alice.RuntimeDir())
	conn := map[string]any{"transport": "tcp", "ip": "127.0.0.1", "key": testenv.RandomHex(16), "signature_scheme": "hmac-sha256",
		"kernel_name": "python3"}
	for _, name := range []string{"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"} {
		conn[name] = freeLowPort(t)
	}
	data, _ := json.Marshal(conn)
	if err := os.WriteFile(aliceFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(aliceFile, alice.UID, alice.GID); err != nil {
		t.Fatal(err)
	}

	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: bk.Cmd.Process.Pid, UsedBytes: 1 << 30})
	d, sock := sharedDaemon(t, gpu, []testenv.User{alice, bob}, daemonArgs...)

	ak := alice.StartKernel(t, aliceFile)
	testenv.WaitKernelListening(t, aliceFile, 60*time.Second)
	testenv.RunCell(t, aliceFile, "import torch; secret_weights = torch.ones(64)", 60*time.Second)
	gpu.Set(t, testenv.FakeProc{PID: bk.Cmd.Process.Pid, UsedBytes: 1 << 30}, testenv.FakeProc{PID: ak.Cmd.Process.Pid, UsedBytes: 2 << 30})
	testenv.Poll(t, 60*time.Second, "the magics in both kernels of id "+id, func() bool {
		return len(d.Logs("magics injected", map[string]any{"kernel_id": id})) >= 2
	})
	return sameIDKernels{id: id, alice: alice, bob: bob, aliceFile: aliceFile, bobFile: bobFile, ak: ak, bk: bk, gpu: gpu, d: d, sock: sock}
}

// freeLowPort is a free TCP port of 127.0.0.1 below the ephemeral range
// (Linux's default starts at 32768), never one picked before in this test.
func freeLowPort(t *testing.T) int {
	t.Helper()
	usedLowPortsMu.Lock() // the tests run in parallel
	defer usedLowPortsMu.Unlock()
	for i := 0; i < 1000; i++ {
		port := 20000 + rand.IntN(12000)
		if usedLowPorts[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		usedLowPorts[port] = true
		return port
	}
	t.Fatal("no free port between 20000 and 32000")
	return 0
}

var (
	usedLowPortsMu sync.Mutex
	usedLowPorts   = map[int]bool{} // guarded by usedLowPortsMu
)
