// Package procstest writes fixture /proc trees for tests and benchmarks of
// procs and its users: stat, status, cmdline, environ and fd links as Linux
// writes them, plus net/tcp. Test code only.
package procstest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Proc describes one process of a fixture /proc tree.
type Proc struct {
	PID, PPID, PGID, SID int
	UID                  uint32
	Start                uint64 // stat field 22
	Comm                 string
	Argv                 []string
	Env                  []string // KEY=VALUE
	NSpid                []int    // nil: [PID]
	Sockets              []uint64 // fd links socket:[N]
	State                string   // stat field 3; "" is "S" (sleeping), "Z" a zombie
	Tgid                 int      // status Tgid; 0 is PID (a process; another: a thread of Tgid)
	Omit                 []string // files not written (a process vanishing mid-scan)
	AsDir                []string // files written as directories (unreadable: EISDIR)
}

// StatLine renders /proc/<pid>/stat as Linux 6.x writes it (52 fields).
func (p Proc) StatLine() string {
	comm := p.Comm
	if comm == "" {
		comm = "proc"
	}
	state := p.State
	if state == "" {
		state = "S"
	}
	return fmt.Sprintf("%d (%s) %s %d %d %d 0 -1 4194560 1515 0 3 0 12 4 0 0 20 0 1 0 %d 23187456 2412 "+
		"18446744073709551615 94375869378560 94375872045809 140726546325552 0 0 0 0 16781312 134235650 1 0 0 "+
		"17 3 0 0 0 0 0 94375872706576 94375872803648 94375885099008 140726546331187 140726546331244 "+
		"140726546331244 140726546333669 0\n", p.PID, comm, state, p.PPID, p.PGID, p.SID, p.Start)
}

// StatusText renders /proc/<pid>/status with the lines around Uid and NSpid
// that a real one has.
func (p Proc) StatusText() string {
	ns := p.NSpid
	if ns == nil {
		ns = []int{p.PID}
	}
	nsText := make([]string, len(ns))
	for i, n := range ns {
		nsText[i] = strconv.Itoa(n)
	}
	join := strings.Join(nsText, "\t")
	return fmt.Sprintf("Name:\t%s\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t%d\n"+
		"TracerPid:\t0\nUid:\t%d\t%d\t%d\t%d\nGid:\t%d\t%d\t%d\t%d\nFDSize:\t64\nGroups:\t%d \n"+
		"NStgid:\t%s\nNSpid:\t%s\nNSpgid:\t%d\nNSsid:\t%d\nKthread:\t0\nVmPeak:\t   22644 kB\nVmSize:\t   22644 kB\n"+
		"VmLck:\t       0 kB\nVmPin:\t       0 kB\nVmHWM:\t    9648 kB\nVmRSS:\t    9648 kB\nRssAnon:\t    1280 kB\n"+
		"RssFile:\t    8368 kB\nRssShmem:\t       0 kB\nVmData:\t    1464 kB\nVmStk:\t     132 kB\nVmExe:\t    2604 kB\n"+
		"VmLib:\t    3204 kB\nVmPTE:\t      80 kB\nVmSwap:\t       0 kB\nHugetlbPages:\t       0 kB\nCoreDumping:\t0\n"+
		"THP_enabled:\t1\nThreads:\t1\nSigQ:\t0/514579\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n"+
		"SigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t0000000008000002\n"+
		"CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"+
		"CapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\nNoNewPrivs:\t0\nSeccomp:\t0\n"+
		"Cpus_allowed:\tffff\nCpus_allowed_list:\t0-15\nvoluntary_ctxt_switches:\t38\nnonvoluntary_ctxt_switches:\t2\n",
		p.Comm, cmpOr(p.Tgid, p.PID), p.PID, p.PPID, p.UID, p.UID, p.UID, p.UID, p.UID, p.UID, p.UID, p.UID, p.UID,
		join, join, p.PGID, p.SID)
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func nulJoin(parts []string) string {
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "\x00") + "\x00"
}

// WriteTree writes procs under root as /proc would show them.
func WriteTree(tb testing.TB, root string, procs []Proc) {
	tb.Helper()
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.PID))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			tb.Fatal(err)
		}
		files := map[string]string{
			"stat":    p.StatLine(),
			"status":  p.StatusText(),
			"cmdline": nulJoin(p.Argv),
			"environ": nulJoin(append([]string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}, p.Env...)),
		}
		for name, content := range files {
			path := filepath.Join(dir, name)
			switch {
			case contains(p.Omit, name):
			case contains(p.AsDir, name):
				if err := os.MkdirAll(filepath.Join(path, "unreadable"), 0o755); err != nil {
					tb.Fatal(err)
				}
			default:
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					tb.Fatal(err)
				}
			}
		}
		for i, ino := range p.Sockets {
			link := filepath.Join(dir, "fd", strconv.Itoa(10+i))
			if err := os.Symlink(fmt.Sprintf("socket:[%d]", ino), link); err != nil {
				tb.Fatal(err)
			}
		}
		// Every process has stdin/out/err; not sockets.
		for fd, target := range []string{"/dev/null", "pipe:[4242]", "anon_inode:[eventpoll]"} {
			if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(fd))); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// WriteChildren writes /proc/<pid>/task/<pid>/children for each process
// of procs, listing the processes of procs whose parent it is, as a kernel
// with CONFIG_PROC_CHILDREN does (WriteTree leaves them out: ChildrenOf
// then reads every stat, as without it).
func WriteChildren(tb testing.TB, root string, procs []Proc) {
	tb.Helper()
	kids := map[int][]string{}
	for _, p := range procs {
		if p.Tgid == 0 || p.Tgid == p.PID {
			kids[p.PPID] = append(kids[p.PPID], strconv.Itoa(p.PID))
		}
	}
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.PID), "task", strconv.Itoa(p.PID))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		text := ""
		if len(kids[p.PID]) > 0 {
			text = strings.Join(kids[p.PID], " ") + " "
		}
		if err := os.WriteFile(filepath.Join(dir, "children"), []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// Replace writes p in place of whatever process had its pid, as a pid
// reused: its directory is a new one (another inode, as procfs gives a
// reused pid), never the old one rewritten.
func Replace(tb testing.TB, root string, p Proc) {
	tb.Helper()
	tmp, err := os.MkdirTemp(root, ".new-")
	if err != nil {
		tb.Fatal(err)
	}
	WriteTree(tb, tmp, []Proc{p})
	dir := filepath.Join(root, strconv.Itoa(p.PID))
	old := filepath.Join(tmp, "old")
	if err := os.Rename(dir, old); err != nil && !os.IsNotExist(err) {
		tb.Fatal(err)
	}
	if err := os.Rename(filepath.Join(tmp, strconv.Itoa(p.PID)), dir); err != nil {
		tb.Fatal(err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		tb.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// NetTCP renders /proc/net/tcp (or tcp6 when v6) lines: listen is port →
// inode in state 0A; one established connection is added as noise.
func NetTCP(v6 bool, listen map[int]uint64) string {
	var b strings.Builder
	b.WriteString("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")
	local := "0100007F"
	if v6 {
		local = "00000000000000000000000001000000"
	}
	i := 0
	for port, ino := range listen {
		fmt.Fprintf(&b, "%4d: %s:%04X %s:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 %d 1 0000000000000000 100 0 0 10 0\n",
			i, local, port, strings.Repeat("0", len(local)), ino)
		i++
	}
	fmt.Fprintf(&b, "%4d: %s:%04X %s:C350 01 00000000:00000000 02:00000A3C 00000000  1000        0 777777 2 0000000000000000 20 4 30 10 -1\n",
		i, local, 8888, local)
	return b.String()
}

// WriteNet writes <root>/net/tcp (v4) and, when v6 is not nil, tcp6, each
// listing port → inode as listening sockets.
func WriteNet(tb testing.TB, root string, v4, v6 map[int]uint64) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "tcp"), []byte(NetTCP(false, v4)), 0o644); err != nil {
		tb.Fatal(err)
	}
	if v6 != nil {
		if err := os.WriteFile(filepath.Join(root, "net", "tcp6"), []byte(NetTCP(true, v6)), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// Tree returns a synthetic box of about n processes (n ≥ 300): init,
// kernel threads, a Jupyter server with the given number of kernels whose
// trees hold most processes (DataLoader-like workers and deep chains),
// orphans of a killed kernel (session 9999), and unrelated daemons with
// children. kernelPIDs lists the live kernels; their start time is their pid.
func Tree(n, kernels int) (procs []Proc, kernelPIDs []int) {
	add := func(p Proc) {
		if p.Start == 0 {
			p.Start = uint64(p.PID)
		}
		if p.Comm == "" {
			p.Comm = "python3"
		}
		procs = append(procs, p)
	}
	add(Proc{PID: 1, PGID: 1, SID: 1, Comm: "systemd", Argv: []string{"/sbin/init"}})
	add(Proc{PID: 2, Comm: "kthreadd"})
	for pid := 3; pid < 103; pid++ {
		add(Proc{PID: pid, PPID: 2, Comm: fmt.Sprintf("kworker/%d:0", pid)})
	}
	add(Proc{PID: 500, PPID: 1, PGID: 500, SID: 500, UID: 1000, Argv: []string{"python3", "-m", "jupyter", "notebook"}})
	for i := range 20 { // orphans of the killed kernel 9999
		add(Proc{PID: 9000 + i, PPID: 1, PGID: 9999, SID: 9999, UID: 1000, Start: 9999 + uint64(i), Argv: []string{"python3", "orphan"}})
	}
	perKernel := (n - 300) * 3 / 4 / max(1, kernels)
	for k := range kernels {
		kpid := 10000 + k*(perKernel+1000)
		kernelPIDs = append(kernelPIDs, kpid)
		sess := []string{fmt.Sprintf("JPY_SESSION_NAME=/home/alice/nb%d.ipynb", k)}
		add(Proc{PID: kpid, PPID: 500, PGID: kpid, SID: kpid, UID: 1000, Env: sess,
			Argv: []string{"python3", "-m", "ipykernel_launcher", "-f", fmt.Sprintf("/run/jupyter/kernel-%d.json", k)}})
		workers := perKernel / 2
		for w := 1; w <= workers; w++ {
			add(Proc{PID: kpid + w, PPID: kpid, PGID: kpid, SID: kpid, UID: 1000, Env: sess, Argv: []string{"python3", "-c", "worker"}})
		}
		parent := kpid + 1
		for d := workers + 1; d < perKernel; d++ { // a deep chain under the first worker
			add(Proc{PID: kpid + d, PPID: parent, PGID: kpid, SID: kpid, UID: 1000, Env: sess, Argv: []string{"sh", "-c", "deep"}})
			parent = kpid + d
		}
	}
	for pid := 200000; len(procs) < n; pid += 3 { // daemons, each with two children
		add(Proc{PID: pid, PPID: 1, PGID: pid, SID: pid, Argv: []string{"/usr/sbin/daemon", "--foreground"}})
		add(Proc{PID: pid + 1, PPID: pid, PGID: pid, SID: pid, UID: 1001, Argv: []string{"worker", "a"}})
		add(Proc{PID: pid + 2, PPID: pid, PGID: pid, SID: pid, UID: 1001, Argv: []string{"worker", "b"}})
	}
	return procs, kernelPIDs
}
