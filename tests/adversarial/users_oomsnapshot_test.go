package adversarial

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// kernelPost runs a cell in the kernel of connFile that POSTs body to the
// daemon's path through the injected magics (as the kernel's own process,
// which is how the daemon knows whose it is), and returns the status and
// reply.
func kernelPost(t *testing.T, connFile, path, body string) (int, string) {
	t.Helper()
	code := fmt.Sprintf(`import json, sys
_st, _b = sys.modules["_gpumem_magics"].daemon.sidecar_post(%q, json.loads(%q), 10)
print(json.dumps({"status": _st, "body": _b.decode("utf-8", "replace")}))`, path, body)
	r := testenv.RunCell(t, connFile, code, 60*time.Second)
	var out struct {
		Status int
		Body   string
	}
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if r.Status != "ok" || json.Unmarshal([]byte(lines[len(lines)-1]), &out) != nil {
		t.Fatalf("POST %s from the kernel: %+v", path, r)
	}
	return out.Status, out.Body
}

// TestOOMAndSnapshotsThroughAnotherUsersKernelID: bob names his kernel's
// file after alice's kernel id (startSameIDKernels). A kernel's
// out-of-memory report and its memory snapshots are its own by connection
// file: bob's report is recorded as his kernel's, never hers; through the
// shared id bob lists, reads and downloads none of her snapshots, even
// naming her connection file; alice sees hers, not his.
func TestOOMAndSnapshotsThroughAnotherUsersKernelID(t *testing.T) {
	t.Parallel()
	k := startSameIDKernels(t)
	base := "/api/v1/kernels/" + k.id
	var cu crossUser
	defer cu.summary(t)

	// Bob's kernel reports an out-of-memory error.
	st, body := kernelPost(t, k.bobFile, "/api/v1/oom",
		`{"framework":"torch","message":"CUDA out of memory. Tried to allocate 2.00 GiB","requested_bytes":2147483648}`)
	var ev struct {
		User           string `json:"user"`
		ConnectionFile string `json:"connection_file"`
	}
	if st != 200 || json.Unmarshal([]byte(body), &ev) != nil || ev.User != k.bob.Name || ev.ConnectionFile != k.bobFile {
		t.Errorf("bob's out-of-memory report: %d %.400s, want it recorded as his kernel's (%s, %s)", st, body, k.bob.Name, k.bobFile)
	}
	for _, who := range []testenv.User{k.alice, k.bob} {
		st, body := apiAs(t, who, k.sock, "GET", "/api/v1/oom", "")
		mine := strings.Contains(body, "Tried to allocate 2.00 GiB")
		if who.Name == k.alice.Name {
			cu.read(t, mine || strings.Contains(body, k.bobFile), fmt.Sprintf("alice's GET /api/v1/oom (%d) shows bob's event: %.300s", st, body))
		} else if st != 200 || !mine {
			t.Errorf("bob's GET /api/v1/oom: %d %.300s, want his event", st, body)
		}
	}

	// Alice's kernel hands over a file of hers as a snapshot (its
	// reduction may fail: the entry is kept either way).
	snap := k.alice.Home + "/secret-snapshot.pickle"
	if r := testenv.RunCell(t, k.aliceFile, fmt.Sprintf("open(%q, 'wb').write(b'\\x80\\x04N.')", snap), 60*time.Second); r.Status != "ok" {
		t.Fatalf("write alice's file from her kernel: %+v", r)
	}
	st, body = kernelPost(t, k.aliceFile, "/api/v1/snapshots", fmt.Sprintf(`{"path":%q,"reason":"manual"}`, snap))
	var info struct{ ID string }
	if st != 202 || json.Unmarshal([]byte(body), &info) != nil || info.ID == "" {
		t.Fatalf("alice's snapshot: %d %.300s", st, body)
	}
	hers := func(body string) bool {
		return strings.Contains(body, "secret-snapshot") || strings.Contains(body, k.aliceFile) || strings.Contains(body, `"id":"`+info.ID+`"`)
	}
	for _, q := range []string{"", "?connection_file=" + url.QueryEscape(k.aliceFile)} {
		st, body := k.bobAPI(t, "GET", base+"/snapshots"+q, "")
		cu.read(t, hers(body), fmt.Sprintf("bob's GET %s/snapshots%s (%d) lists alice's: %.300s", base, q, st, body))
		if q == "" && st != 200 {
			t.Errorf("bob's GET %s/snapshots: %d %.300s, want his own (empty) list", base, st, body)
		}
		for _, p := range []string{"/snapshots/" + info.ID, "/snapshots/" + info.ID + "/raw"} {
			st, body := k.bobAPI(t, "GET", base+p+q, "")
			cu.read(t, st == 200 || hers(body) || strings.Contains(body, "\x80\x04"), fmt.Sprintf("bob's GET %s%s%s (%d): %.300s", base, p, q, st, body))
		}
	}
	st, body = apiAs(t, k.alice, k.sock, "GET", base+"/snapshots", "")
	if st != 200 || !strings.Contains(body, `"id":"`+info.ID+`"`) {
		t.Errorf("alice's GET of her own snapshots: %d %.300s", st, body)
	}
	st, body = apiAs(t, k.alice, k.sock, "GET", base+"/snapshots/"+info.ID+"/raw", "")
	if st != 200 || body != "\x80\x04N." {
		t.Errorf("alice's download of her snapshot: %d %q", st, body)
	}
}
