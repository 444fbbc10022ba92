package adversarial

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestAlertFilesShowNoOtherUsersKernels: the notebook alert files of a
// shared daemon, beside its socket, are read by every user's kernels. Both
// alice's and bob's idle kernels (3 GiB and 2 GiB, each under its own
// server) are warned that culling will report them; neither user, as a
// real process of theirs, can read from any file or dir beside the socket
// the other's kernel id or what the other's kernel holds (the README lets
// them see other users as per-user totals only). And each one's own
// kernel still prints its own warning in a cell, once, with one
// "gpumem: ", and not the other's.
//
// An older build fails: it wrote one 0644 file with every kernel's id and
// warning, and its cull warning read "gpumem: gpumem: ...".
func TestAlertFilesShowNoOtherUsersKernels(t *testing.T) {
	t.Parallel()
	testenv.Require(t, "ipykernel", "jupyter_client")
	kind := testenv.ServerKinds()[0]
	alice, bob := testenv.MakeUser(t, "la"), testenv.MakeUser(t, "lb")
	type side struct {
		user  testenv.User
		id    string
		front *testenv.Frontend
		held  string // what the warning says the kernel holds
	}
	sides := []*side{{user: alice, held: "3.0 GiB"}, {user: bob, held: "2.0 GiB"}}
	var procs []testenv.FakeProc
	for i, s := range sides {
		srv := testenv.StartServerWith(t, kind, testenv.ServerOptions{As: &sides[i].user})
		sess := srv.CreateSession(t, s.user.Name+"/plans.ipynb")
		s.id = sess.Kernel.ID
		file := srv.ConnectionFile(s.id)
		testenv.WaitKernelListening(t, file, 60*time.Second)
		pids := testenv.KernelPIDs(file)
		if len(pids) != 1 {
			t.Fatalf("%s's kernel processes: %v", s.user.Name, pids)
		}
		// The user's notebook, attached before the daemon: its kernel is
		// idle from then on.
		s.front = testenv.StartFrontend(t, &testenv.Kernel{Dir: srv.Dir, ConnectionFile: file, ID: s.id})
		procs = append(procs, testenv.FakeProc{PID: pids[0], UsedBytes: uint64(3-i) << 30})
	}
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, procs...)
	d, sock := sharedDaemon(t, gpu, []testenv.User{alice, bob},
		"--cull-idle=2s", "--cull-warn=10m", "--cull-min-memory=1GiB", "--cull-action=report")
	for _, s := range sides {
		d.WaitLog(t, 60*time.Second, "magics injected", map[string]any{"kernel_id": s.id})
		d.WaitLog(t, 60*time.Second, "idle kernel holds GPU memory: warned", map[string]any{"kernel_id": s.id})
	}
	// The alert files are written in the sample whose report shows the
	// warnings, before it is published.
	testenv.Poll(t, 30*time.Second, "both warnings in the report", func() bool {
		n := 0
		for _, a := range d.Report(t).Alerts {
			if a.Kind == attribution.AlertCull && len(a.Kernels) == 1 && (a.Kernels[0] == sides[0].id || a.Kernels[0] == sides[1].id) {
				n++
			}
		}
		return n == 2
	})

	var cu crossUser
	defer cu.summary(t)
	var paths []string
	isDir := map[string]bool{}
	err := filepath.WalkDir(filepath.Dir(sock), func(p string, e fs.DirEntry, err error) error {
		if err == nil && (e.IsDir() || e.Type().IsRegular()) {
			paths = append(paths, p)
			isDir[p] = e.IsDir()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range sides {
		other := sides[1-i]
		ownSeen := false
		for _, p := range paths {
			argv := []string{"cat", p}
			if isDir[p] {
				argv = []string{"ls", "-la", p}
			}
			out, _, err := s.user.Run(nil, argv...)
			if err != nil {
				continue // not theirs to read
			}
			cu.read(t, strings.Contains(out, other.id) || strings.Contains(out, other.held),
				s.user.Name+" read "+p+", which names "+other.user.Name+"'s kernel or what it holds:\n"+out)
			ownSeen = ownSeen || strings.Contains(out, s.id)
		}
		if !ownSeen {
			t.Errorf("no file beside the socket that %s can read holds the warning of their kernel %s (files: %v)", s.user.Name, s.id, paths)
		}
	}

	// Each kernel prints its own warning, once, with one prefix: the
	// daemon's sentence after "gpumem: ".
	for i, s := range sides {
		out := s.front.Cell(t, "pass").Text()
		want := "gpumem: this kernel holds " + s.held + " and has been idle "
		if strings.Count(out, want) != 1 || strings.Count(out, "gpumem:") != 1 || strings.Contains(out, sides[1-i].held) {
			t.Errorf("%s's cell printed %q, want its warning once: %q...", s.user.Name, out, want)
		}
	}
}
