package testenv

import (
	"encoding/json"
	"os/exec"
	"testing"
	"time"
)

// frontendPy runs one cell in a kernel as a real frontend would (through
// jupyter_client, store_history on) and prints {"status", "stdout", "ename",
// "evalue"} as JSON.
const frontendPy = `
import json, sys, time
from jupyter_client import BlockingKernelClient
cf, code, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
# A kernel just started may not answer its heartbeat yet, and wait_for_ready
# then says "Kernel died": retry with a fresh client until the deadline.
deadline = time.monotonic() + timeout
while True:
    kc = BlockingKernelClient(connection_file=cf)
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
        break
    except RuntimeError:
        kc.stop_channels()
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
try:
    out = []
    reply = kc.execute_interactive(code, timeout=timeout, store_history=True,
        output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
    c = reply["content"]
    print(json.dumps({"status": c["status"], "stdout": "".join(out),
                      "ename": c.get("ename", ""), "evalue": c.get("evalue", "")}))
finally:
    kc.stop_channels()
`

// KernelOwnNames is a Python condition on a user_ns name k, true for the
// names IPython itself puts in every namespace (IPython 8.x's later releases
// and 9 add "open", a wrapper of io.open): tests that check gpumem adds no
// name skip them.
const KernelOwnNames = `(k == "open" and getattr(get_ipython().user_ns[k], "__wrapped__", None) is __import__("io").open)`

// CellResult is what RunCell returns.
type CellResult struct {
	Status string `json:"status"`
	Stdout string `json:"stdout"`
	EName  string `json:"ename"`
	EValue string `json:"evalue"`
}

// RunCell executes code in the kernel behind connFile as a normal frontend
// cell (store_history=True) through jupyter_client, and returns its printed
// output. It fails the test if the cell does not finish within timeout.
func RunCell(t testing.TB, connFile, code string, timeout time.Duration) CellResult {
	t.Helper()
	Require(t, "jupyter_client")
	cmd := exec.Command(Python(), "-c", frontendPy, connFile, code, formatSeconds(timeout))
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("running cell %q in %s: %v\n%s", code, connFile, err, msg)
	}
	var r CellResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("running cell %q: bad driver output %q: %v", code, out, err)
	}
	return r
}

func formatSeconds(d time.Duration) string {
	b, _ := json.Marshal(d.Seconds())
	return string(b)
}
