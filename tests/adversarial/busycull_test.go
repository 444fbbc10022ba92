package adversarial

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// otherClientPy is another client of the kernel (a second browser tab, a
// console, a tool), argv: connection file, mode, stop file, period. Until
// the stop file exists it sends, every period:
//   - kernel_info: a kernel_info_request on control, in its own session;
//   - subshell: first a create_subshell_request on control; with a
//     subshell (ipykernel >= 7) an execute_request in it (subshell_id in
//     its header), else (ipykernel 6: an unknown control message, busy and
//     idle published, no reply) the create_subshell_request again.
//
// It prints one JSON line: the subshell created, if any.
const otherClientPy = `
import json, os, sys, time
from jupyter_client import BlockingKernelClient
cf, mode, stop, every = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
kc = BlockingKernelClient(connection_file=cf)
kc.load_connection_file()
kc.start_channels()
deadline = time.monotonic() + 300
sid = None
def create():
    kc.control_channel.send(kc.session.msg("create_subshell_request", {}))
if mode == "subshell":
    create()
    try:
        sid = kc.get_control_msg(timeout=10)["content"].get("subshell_id")
    except Exception:
        sid = None
print(json.dumps({"subshell_id": sid}), flush=True)
while not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(every)
    if mode == "kernel_info":
        kc.control_channel.send(kc.session.msg("kernel_info_request"))
    elif sid:
        msg = kc.session.msg("execute_request", {"code": "1 + 1", "silent": False, "store_history": False,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
        msg["header"]["subshell_id"] = sid
        kc.shell_channel.send(msg)
    else:
        create()
kc.stop_channels()
`

// A kernel running a cell is busy until that cell's own idle, whatever
// other clients send it meanwhile: another session's kernel_info on
// control, a subshell's requests, gpumem attach re-injecting the magics.
// With culling after 3 s idle (shutdown), a 40 s cell holding 2 GiB runs to
// its end with no warning and no cull; once it has ended the idle kernel is
// culled, as it should be.
func TestBusyKernelNotCulledByOtherClients(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"kernel_info", "subshell", "attach"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			r := startCullRig(t, "shutdown")
			const warned, culled = "idle kernel holds GPU memory: warned", "idle kernel holding GPU memory shut down through its server"
			marker := filepath.Join(t.TempDir(), "cell-started")
			type result struct {
				rep testenv.FrontendReply
				err error
			}
			done := make(chan result, 1)
			go func() {
				rep, err := r.front.Execute(context.Background(), testenv.ExecuteRequest{StoreHistory: true, Timeout: 3 * time.Minute,
					Code: fmt.Sprintf("import pathlib, time\npathlib.Path(%q).touch()\nfor _ in range(40):\n    time.sleep(1)\nprint('cell done')", marker)})
				done <- result{rep, err}
			}()
			testenv.Poll(t, 30*time.Second, "the cell to start", func() bool {
				_, err := os.Stat(marker)
				return err == nil
			})
			warnedBefore := strings.Count(r.d.Output(), warned)

			stop := filepath.Join(t.TempDir(), "stop")
			var attach chan error
			var attachOut strings.Builder
			switch mode {
			case "kernel_info", "subshell":
				other := testenv.Start(t, testenv.Env(r.srv.Dir), r.srv.Dir, testenv.Python(), "-c", otherClientPy, r.conn, mode, stop, "6")
				t.Cleanup(func() { t.Logf("other client: %s", other.Output()) })
			case "attach":
				// It waits for the cell (its injection queues behind it).
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				t.Cleanup(cancel)
				cmd := exec.CommandContext(ctx, gpumemBin, "attach", "--timeout=3m", r.id)
				cmd.Env = testenv.Env(r.srv.Dir)
				cmd.Stdout, cmd.Stderr = &attachOut, &attachOut
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				attach = make(chan error, 1)
				go func() { attach <- cmd.Wait() }()
			}

			var res result
		wait:
			for {
				select {
				case res = <-done:
					break wait
				case <-time.After(100 * time.Millisecond):
				}
				if _, ok := r.d.FindLog(culled, map[string]any{"kernel_id": r.id}); ok {
					t.Fatal("the kernel was culled while its cell ran")
				}
			}
			if err := os.WriteFile(stop, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if res.err != nil {
				t.Fatalf("the cell: %v", res.err)
			}
			if res.rep.Status() != "ok" || !strings.Contains(res.rep.Text(), "cell done") {
				// A shutdown through the server interrupts the cell first.
				t.Fatalf("the cell did not finish (culled?): status %s, output %q", res.rep.Status(), res.rep.Text())
			}
			if n := strings.Count(r.d.Output(), warned); n != warnedBefore {
				t.Errorf("the kernel was warned as idle %d times while its cell ran", n-warnedBefore)
			}
			if !r.listed(t) {
				t.Fatal("the server no longer runs the kernel")
			}
			if attach != nil {
				if err := <-attach; err != nil || !strings.Contains(attachOut.String(), r.id) {
					t.Fatalf("gpumem attach: %v\n%s", err, attachOut.String())
				}
			}
			// Idle now: culled, as it should be.
			r.d.WaitLog(t, 60*time.Second, culled, map[string]any{"kernel_id": r.id})
		})
	}
}
