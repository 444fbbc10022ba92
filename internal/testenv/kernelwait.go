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
	var conn struct {
		IP        string `json:"ip"`
		Transport string `json:"transport"`
		ShellPort int    `json:"shell_port"`
		HBPort    int    `json:"hb_port"`
	}
	Poll(t, timeout, "connection file "+connFile, func() bool {
		data, err := os.ReadFile(connFile)
		return err == nil && json.Unmarshal(data, &conn) == nil && conn.HBPort > 0 && conn.ShellPort > 0
	})
	if conn.Transport != "tcp" {
		t.Fatalf("%s: transport %q: WaitKernelListening knows only tcp", connFile, conn.Transport)
	}
	listening := func(port int) bool {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(conn.IP, strconv.Itoa(port)), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}
	Poll(t, timeout, "kernel "+connFile+" to listen", func() bool {
		return listening(conn.HBPort) && listening(conn.ShellPort)
	})
}
