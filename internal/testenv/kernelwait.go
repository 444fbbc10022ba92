package testenv

import (
	"encoding/json"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

// WaitKernelListening polls (deadline timeout) until the kernel behind
// connFile accepts TCP connections on its heartbeat and shell ports.
//
// Call it before RunCell on a kernel that may still be starting: a server
// writes the connection file before the kernel binds its ports, and
// jupyter_client's wait_for_ready gives up at once with "Kernel died before
// replying to kernel_info" when its first heartbeat finds nobody listening.
func WaitKernelListening(t testing.TB, connFile string, timeout time.Duration) {
	t.Helper()
	type connInfo struct {
		IP        string `json:"ip"`
		Transport string `json:"transport"`
		ShellPort int    `json:"shell_port"`
		HBPort    int    `json:"hb_port"`
	}
	listening := func(ip string, port int) bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}
	// The file is read again at every poll: a kernel or its manager may
	// rewrite it (ipykernel deletes and rewrites it at start-up; a port
	// that turned out taken is replaced), and the ports to wait for are
	// the ones it names now.
	Poll(t, timeout, "kernel "+connFile+" to listen", func() bool {
		data, err := os.ReadFile(connFile)
		var conn connInfo
		if err != nil || json.Unmarshal(data, &conn) != nil || conn.HBPort <= 0 || conn.ShellPort <= 0 {
			return false
		}
		if conn.Transport != "tcp" {
			t.Fatalf("%s: transport %q: WaitKernelListening knows only tcp", connFile, conn.Transport)
		}
		return listening(conn.IP, conn.HBPort) && listening(conn.IP, conn.ShellPort)
	})
}
