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
// vanish or cannot be read are left out; only an unreadable root is an error.
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
		data, err := readAt(rootfd, strconv.Itoa(pid)+"/cmdline", buf)
		if err != nil {
			continue
		}
		buf = data[:0]
		if argv := parseCmdline(data); len(argv) > 0 {
			out[pid] = argv
		}
	}
	return out, nil
}

// CommandLine is argv joined by spaces, cut to at most max runes (an
// ellipsis marks the cut; a UTF-8 character is never cut in half), with
// control characters shown as spaces: for logs and messages.
func CommandLine(argv []string, max int) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.Join(argv, " "))
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	runes := []rune(s)
	return string(runes[:max-1]) + "…"
}
