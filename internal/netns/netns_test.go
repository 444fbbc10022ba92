package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gpumem/gpumem/internal/testenv"
)

func TestCheckAddr(t *testing.T) {
	tests := []struct {
		network, addr string
		ok            bool
	}{
		{"tcp", "127.0.0.1:8888", true},
		{"tcp6", "[::1]:8888", true},
		{"tcp", "localhost:8888", false},
		{"tcp", "jupyter-alice:8888", false},
		{"unix", "/tmp/kernel-1", false},
		{"udp", "127.0.0.1:53", false},
		{"tcp", "127.0.0.1", false},
	}
	for _, tt := range tests {
		err := checkAddr(tt.network, tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("checkAddr(%q, %q) = %v, want ok=%v", tt.network, tt.addr, err, tt.ok)
		}
	}
	if err := checkAddr("tcp", "localhost:1"); !errors.Is(err, ErrHostName) {
		t.Errorf("a host name: %v, want ErrHostName", err)
	}
}

// TestDialReachesAnotherNamespace: the same loopback address and port is
// served twice, by this process in its own namespace and by a listener in
// a fresh one (unshare --net). Dial through the fresh namespace reaches
// the latter, and afterwards every thread of this process is still in its
// own namespace.
func TestDialReachesAnotherNamespace(t *testing.T) {
	testenv.RequireRoot(t, "unshare --net and setns need root")
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal(err)
	}
	port := testenv.ServeLoopback(t, func(c net.Conn) { _, _ = io.WriteString(c, "host\n") })
	// The listener brings its namespace's loopback up itself, binds the
	// host listener's port, says so, then greets and echoes one line.
	script := `
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifr = struct.pack("16sH", b"lo", 0)
flags = struct.unpack("16sH", fcntl.ioctl(s.fileno(), 0x8913, ifr))[1]
fcntl.ioctl(s.fileno(), 0x8914, struct.pack("16sH", b"lo", flags | 1))
l = socket.socket()
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(1)
print("ready", flush=True)
c, _ = l.accept()
c.sendall(b"pod\n")
c.sendall(c.makefile().readline().encode())
`
	cmd := exec.Command("unshare", "--net", "--", python, "-c", script, strconv.Itoa(port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("the listener in its namespace: %q %v", line, err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	before := threadNamespaces(t)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := Dial(ctx, fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), "tcp", addr)
	if err != nil {
		t.Fatalf("Dial in the namespace: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	if greet, err := r.ReadString('\n'); err != nil || greet != "pod\n" {
		t.Fatalf("Dial in the namespace reached %q (%v), want the namespace's listener", greet, err)
	}
	if _, err := io.WriteString(conn, "hello\n"); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil || got != "hello\n" {
		t.Fatalf("echo through the namespace: %q %v", got, err)
	}
	for tid, ns := range threadNamespaces(t) {
		if ns != before[0] {
			t.Errorf("thread %d is in network namespace %s after Dial, the process's is %s", tid, ns, before[0])
		}
	}

	if _, err := Dial(ctx, "/proc/0/ns/net", "tcp", addr); err == nil {
		t.Error("Dial into a namespace that does not exist: no error")
	}
}

// threadNamespaces maps each thread of this process to its network
// namespace; key 0 is the process's own.
func threadNamespaces(t *testing.T) map[int]string {
	t.Helper()
	out := map[int]string{}
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	out[0] = self
	tasks, err := filepath.Glob("/proc/self/task/*/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tasks {
		ns, err := os.Readlink(p)
		if err != nil {
			continue // the thread ended
		}
		tid, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(p))))
		out[tid] = ns
	}
	return out
}
