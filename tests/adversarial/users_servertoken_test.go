package adversarial

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

// TestServerTokenOnlyToItsServers: GPUMEM_SERVER_TOKEN (a hub's token for
// servers whose files hold none) goes to the servers GPUMEM_SERVER_TOKEN_URLS
// names, and only through a listener of the server file's owner. Bob's own
// server file without a token, on a listener of his that records what it
// gets, never receives it; his files whose url points at alice's listeners
// (TCP, or her unix socket) send nothing there at all. Alice's server, the
// one the token is for, gets it.
func TestServerTokenOnlyToItsServers(t *testing.T) {
	t.Parallel()
	alice, bob := testenv.MakeUser(t, "ta"), testenv.MakeUser(t, "tb")
	hubToken := "hub-admin-token-" + testenv.RandomHex(8)

	hers := startFakeServer(t, alice, "[]", "")
	writeServerFile(t, alice, alice.RuntimeDir(), map[string]any{
		"url": "http://127.0.0.1:" + itoa(hers.Port) + "/user/" + alice.Name + "/", "token": "", "password": false, "root_dir": alice.Home})
	// Listeners of alice's that no server file of hers names.
	hersTCP := startFakeServer(t, alice, "[]", "")
	sock := filepath.Join(alice.Home, "private.sock")
	hersUnix := startFakeServer(t, alice, "[]", sock)

	his := startFakeServer(t, bob, "[]", "")
	for _, u := range []string{
		"http://127.0.0.1:" + itoa(his.Port) + "/",
		"http://127.0.0.1:" + itoa(hersTCP.Port) + "/",
		"http+unix://" + url.PathEscape(sock) + "/",
		// Her allowed server's own URL, claimed by bob's file.
		"http://127.0.0.1:" + itoa(hers.Port) + "/user/" + alice.Name + "/",
	} {
		writeServerFile(t, bob, bob.RuntimeDir(), map[string]any{"url": u, "token": "", "password": false, "root_dir": bob.Home})
	}

	env := []string{"GPUMEM_SERVER_TOKEN=" + hubToken, "GPUMEM_SERVER_TOKEN_URLS=http://127.0.0.1:" + itoa(hers.Port) + "/user/"}
	d, _ := sharedDaemonEnv(t, testenv.NewFakeGPU(t), []testenv.User{alice, bob}, env)
	testenv.Poll(t, 30*time.Second, "alice's server to get the token it is for", func() bool {
		for _, a := range hers.Requests(t) {
			if a == "token "+hubToken {
				return true
			}
		}
		return false
	})
	testenv.Poll(t, 30*time.Second, "bob's own server to be asked", func() bool { return len(his.Requests(t)) > 0 })

	// Several scans later, still nothing of the rest.
	var gotToken, toTCP, toUnix bool
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && !(gotToken && toTCP && toUnix) {
		for _, a := range his.Requests(t) {
			gotToken = gotToken || strings.Contains(a, hubToken)
		}
		toTCP, toUnix = len(hersTCP.Requests(t)) > 0, len(hersUnix.Requests(t)) > 0
		time.Sleep(100 * time.Millisecond)
	}
	var cu crossUser
	defer cu.summary(t)
	cu.read(t, gotToken, "bob's server received GPUMEM_SERVER_TOKEN")
	cu.action(t, toTCP, "bob's server file sent the daemon to alice's TCP listener")
	cu.action(t, toUnix, "bob's server file sent the daemon to alice's unix socket")
	if want := "served by uid " + itoa(alice.UID) + ", but the file belongs to uid " + itoa(bob.UID); !strings.Contains(d.Output(), want) {
		t.Errorf("the daemon's log does not say why bob's files were not asked (%q)", want)
	}
}
