package procs

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"
)

// Cmdlines reads the argv of every process (one read each, nothing else):
// the cheap pass for finding which processes name a file. Processes that
// vanish or that we may not look at are left out; any other failure is an
// error, as for Scan.
func (fs *FS) Cmdlines() (map[int][]string, error) {
	pids, err := fs.pids()
	if err != nil {
		return nil, err
	}
	rootfd, err := syscall.Open(fs.root(), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("read processes: %w", err)
	}
	defer syscall.Close(rootfd)
	out := make(map[int][]string, len(pids))
	buf := make([]byte, 0, 4096)
	for _, pid := range pids {
		data, err := fs.readFile(rootfd, strconv.Itoa(pid)+"/cmdline", pid, "cmdline", buf)
		if vanished(err) || denied(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read processes: %w", err)
		}
		buf = data[:0]
		if argv := parseCmdline(data); len(argv) > 0 {
			out[pid] = argv
		}
	}
	return out, nil
}

// CommandLine is argv joined by spaces ("[comm]" when argv is empty: kernel
// threads, zombies, unreadable), with control characters shown as spaces,
// cut to at most max bytes on a rune boundary with "…": for logs, tables
// and messages.
func CommandLine(argv []string, comm string, max int) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.Join(argv, " "))
	if s == "" && comm != "" {
		s = "[" + comm + "]"
	}
	if len(s) <= max {
		return s
	}
	cut := max - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
