package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// fproc describes one process of a fixture /proc tree.
type fproc struct {
	pid, ppid, pgid, sid int
	uid                  uint32
	start                uint64
	comm                 string
	argv                 []string
	env                  []string // KEY=VALUE
	nspid                []int    // nil: [pid]
	sockets              []uint64 // fd links socket:[N]
	omit                 []string // files not written (a process vanishing mid-scan)
	asDir                []string // files written as directories (unreadable: EISDIR)
}

// statLine renders /proc/<pid>/stat as Linux 6.x writes it (52 fields).
func (p fproc) statLine() string {
	comm := p.comm
	if comm == "" {
		comm = "proc"
	}
	return fmt.Sprintf("%d (%s) S %d %d %d 0 -1 4194560 1515 0 3 0 12 4 0 0 20 0 1 0 %d 23187456 2412 "+
		"18446744073709551615 94375869378560 94375872045809 140726546325552 0 0 0 0 16781312 134235650 1 0 0 "+
		"17 3 0 0 0 0 0 94375872706576 94375872803648 94375885099008 140726546331187 140726546331244 "+
		"140726546331244 140726546333669 0\n", p.pid, comm, p.ppid, p.pgid, p.sid, p.start)
}

// statusText renders /proc/<pid>/status with the lines around Uid and NSpid
// that a real one has.
func (p fproc) statusText() string {
	ns := p.nspid
	if ns == nil {
		ns = []int{p.pid}
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
		p.comm, p.pid, p.pid, p.ppid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid, p.uid,
		join, join, p.pgid, p.sid)
}

func nulJoin(parts []string) string {
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "\x00") + "\x00"
}

// writeFixture writes procs under root as /proc would show them.
func writeFixture(tb testing.TB, root string, procs []fproc) {
	tb.Helper()
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			tb.Fatal(err)
		}
		files := map[string]string{
			"stat":    p.statLine(),
			"status":  p.statusText(),
			"cmdline": nulJoin(p.argv),
			"environ": nulJoin(append([]string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}, p.env...)),
		}
		for name, content := range files {
			path := filepath.Join(dir, name)
			switch {
			case contains(p.omit, name):
			case contains(p.asDir, name):
				if err := os.MkdirAll(filepath.Join(path, "unreadable"), 0o755); err != nil {
					tb.Fatal(err)
				}
			default:
				if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
					tb.Fatal(err)
				}
			}
		}
		for i, ino := range p.sockets {
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// netTCP renders /proc/net/tcp (or tcp6 when v6) lines: listen is port →
// inode in state 0A; one established connection is added as noise.
func netTCP(v6 bool, listen map[int]uint64) string {
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
