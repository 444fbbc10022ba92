package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// TestImageAttributesHostKernels runs the container image's root
// filesystem (deploy/container/build.sh: the binary and the libraries ldd
// lists, nothing else) against a real Jupyter server and kernel on this
// machine, the way the DaemonSet runs it: in its own pid and mount
// namespaces, with the host's /proc mounted at /host/proc
// (GPUMEM_PROC_ROOT) and the kernel's runtime dir mounted at the same path.
//
// Docker's daemon does not run on the dev machines and CI (its client
// does), so this test uses unshare(1) for the namespaces and chroot(8) for
// the image's root; it needs root. The simulated GPU lists the kernel's
// host pid, as NVML does for a caller in the host's pid namespace.
func TestImageAttributesHostKernels(t *testing.T) {
	testenv.RequireRoot(t, "unshare and chroot need root")
	for _, tool := range []string{"unshare", "chroot", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (util-linux, coreutils): %v", tool, err)
		}
	}
	rootfs := imageRootfs(t)

	srv := testenv.StartServer(t, testenv.NotebookServer())
	reap := testenv.NewReaper(t, srv)
	sess := srv.CreateSession(t, "team/train.ipynb")
	conn := srv.ConnectionFile(sess.Kernel.ID)
	testenv.WaitKernelListening(t, conn, 60*time.Second)
	var kernelPID int
	testenv.Poll(t, 30*time.Second, "the kernel's process", func() bool {
		pids := testenv.KernelPIDs(conn)
		if len(pids) == 1 {
			kernelPID = pids[0]
		}
		return len(pids) == 1
	})
	reap.Add(kernelPID)

	const used = 3 << 30
	gpu := testenv.NewFakeGPU(t)
	gpu.Set(t, testenv.FakeProc{PID: kernelPID, UsedBytes: used})
	gpuFile, err := os.ReadFile(gpu.Path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "run", "gpus.json"), gpuFile, 0o644); err != nil {
		t.Fatal(err)
	}
	runtimeDir := srv.RuntimeDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(rootfs, "host", "proc"), filepath.Join(rootfs, runtimeDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// In the new namespaces: the host's /proc at /host/proc, the runtime
	// dir at its own path, and a /proc of the new pid namespace (where the
	// kernel is invisible), then the image's entrypoint under chroot.
	script := `set -e
mount --make-rprivate /
mount --rbind /proc "$ROOTFS/host/proc"
mount --bind "$RUNTIME" "$ROOTFS$RUNTIME"
mount -t proc proc "$ROOTFS/proc"
exec chroot "$ROOTFS" /usr/local/bin/gpumem ls --json`
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount", "--", "sh", "-c", script)
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"ROOTFS=" + rootfs, "RUNTIME=" + runtimeDir,
		"JUPYTER_RUNTIME_DIR=" + runtimeDir,
		"GPUMEM_PROC_ROOT=/host/proc",
		"GPUMEM_FAKE_GPU=/run/gpus.json",
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("gpumem ls in the image did not finish in 60s\n%s", stderr.String())
	}
	if err != nil {
		t.Fatalf("gpumem ls in the image: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	var rep attribution.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("gpumem ls --json: %v\n%s", err, stdout.String())
	}
	var found *attribution.Notebook
	for i := range rep.Notebooks {
		if rep.Notebooks[i].KernelID == sess.Kernel.ID {
			found = &rep.Notebooks[i]
		}
	}
	if found == nil {
		t.Fatalf("the image's gpumem ls does not list kernel %s\n%s\nstderr:\n%s", sess.Kernel.ID, stdout.String(), stderr.String())
	}
	if want := filepath.Join(srv.RootDir, "team", "train.ipynb"); found.Notebook != want {
		t.Errorf("notebook %q, want %q", found.Notebook, want)
	}
	if len(found.PIDs) == 0 || found.PIDs[0] != kernelPID {
		t.Errorf("pids %v, want the kernel's host pid %d first", found.PIDs, kernelPID)
	}
	if found.GPUMemoryBytes != used {
		t.Errorf("%d bytes attributed, want %d", found.GPUMemoryBytes, used)
	}
	if len(rep.Other) != 0 {
		t.Errorf("other processes %+v: the kernel's bytes went astray", rep.Other)
	}
	t.Logf("image rootfs: gpumem ls in pid+mount namespaces attributed %d bytes of pid %s to %s",
		found.GPUMemoryBytes, strconv.Itoa(kernelPID), strings.TrimPrefix(found.Notebook, srv.RootDir))
}

var (
	imageOnce sync.Once
	imageDir  string
	imageErr  error
)

// imageRootfs builds the image's root filesystem once per test binary
// (deploy/container/build.sh) and returns it; TestMain removes it.
func imageRootfs(t *testing.T) string {
	t.Helper()
	imageOnce.Do(func() {
		imageDir, imageErr = os.MkdirTemp("", "gpumem-image-")
		if imageErr != nil {
			return
		}
		out, err := exec.Command("bash", "../../deploy/container/build.sh", imageDir).CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("build.sh: %w\n%s", err, out)
		}
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return filepath.Join(imageDir, "rootfs")
}

// TestMain runs the tests under testenv.RunReaped: they play pods whose
// processes (a server, its kernel, workers in sessions of their own, as a
// uid of their own) only their cgroups' cleanup ends, and a test binary
// killed before its cleanups must not leave them running.
func TestMain(m *testing.M) {
	if testenv.ShortSkipsPackage() {
		os.Exit(0)
	}
	os.Exit(testenv.RunReaped(func() int {
		code := m.Run()
		if imageDir != "" {
			// Mounts were made in the test's own namespaces and are gone.
			os.RemoveAll(imageDir)
		}
		return code
	}))
}
