package testenv

import (
	"encoding/json"
	"net"
	"os"
	"slices"
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

// KernelPID waits (a minute) until the kernel behind connFile listens and
// exactly one live process other than those in not (a restarted kernel's
// previous process, still exiting) runs as that kernel (KernelPIDs), and
// returns it. It reads /proc only: nothing runs in the kernel, so a
// benchmark may call it inside its measured loop.
func KernelPID(t testing.TB, connFile string, not ...int) int {
	t.Helper()
	WaitKernelListening(t, connFile, time.Minute)
	var pid int
	Poll(t, time.Minute, "one kernel process on "+connFile, func() bool {
		pids := slices.DeleteFunc(KernelPIDs(connFile), func(p int) bool { return slices.Contains(not, p) })
		if len(pids) == 1 {
			pid = pids[0]
		}
		return len(pids) == 1
	})
	return pid
}
