package procs

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// statFields are the parts of /proc/<pid>/stat that procs uses.
type statFields struct {
	PID, PPID, PGID, SID int
	Comm                 string
	State                byte
	StartTime            uint64
}

// parseStat parses /proc/<pid>/stat (proc(5)): "pid (comm) state ppid pgrp
// session … starttime(22) …". comm may hold spaces and parentheses, so it
// runs from the first '(' to the last ')'.
func parseStat(data []byte) (statFields, error) {
	var st statFields
	open := bytes.IndexByte(data, '(')
	closing := bytes.LastIndexByte(data, ')')
	if open < 1 || closing < open {
		return st, errors.New("stat: no (comm)")
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(data[:open])))
	if err != nil {
		return st, fmt.Errorf("stat: pid: %w", err)
	}
	st.PID = pid
	st.Comm = string(data[open+1 : closing])

	// Fields after ")": index 0 is field 3 (state), so field n is at n-3.
	const (
		fState     = 0
		fPPID      = 4 - 3
		fPGRP      = 5 - 3
		fSession   = 6 - 3
		fStartTime = 22 - 3
	)
	rest := data[closing+1:]
	for i := 0; i <= fStartTime; i++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		field := rest[:end]
		rest = rest[end:]
		if len(field) == 0 {
			return st, fmt.Errorf("stat: %d fields after comm, want at least %d", i, fStartTime+1)
		}
		switch i {
		case fState:
			st.State = field[0]
		case fPPID:
			st.PPID, err = atoi(field)
		case fPGRP:
			st.PGID, err = atoi(field)
		case fSession:
			st.SID, err = atoi(field)
		case fStartTime:
			st.StartTime, err = strconv.ParseUint(string(field), 10, 64)
		}
		if err != nil {
			return st, fmt.Errorf("stat: field %d: %w", i+3, err)
		}
	}
	return st, nil
}

func atoi(b []byte) (int, error) { return strconv.Atoi(string(b)) }

// statusFields are the parts of /proc/<pid>/status that procs uses.
type statusFields struct {
	UID   uint32 // effective uid, as ps's USER shows
	NSpid []int  // outermost (this /proc's) namespace first, the process's own last
}

// parseStatus reads the Uid: and NSpid: lines of /proc/<pid>/status. A
// missing NSpid line (kernels before 4.1) leaves NSpid nil.
func parseStatus(data []byte) (statusFields, error) {
	var st statusFields
	uidLine := lineValue(data, "Uid:")
	if uidLine == nil {
		return st, errors.New("status: no Uid line")
	}
	uids := bytes.Fields(uidLine)
	if len(uids) < 2 {
		return st, fmt.Errorf("status: Uid line %q", uidLine)
	}
	uid, err := strconv.ParseUint(string(uids[1]), 10, 32)
	if err != nil {
		return st, fmt.Errorf("status: effective uid: %w", err)
	}
	st.UID = uint32(uid)
	if ns := lineValue(data, "NSpid:"); ns != nil {
		for _, f := range bytes.Fields(ns) {
			pid, err := atoi(f)
			if err != nil {
				return st, fmt.Errorf("status: NSpid: %w", err)
			}
			st.NSpid = append(st.NSpid, pid)
		}
	}
	return st, nil
}

// lineValue returns what follows key on the line that starts with key, or
// nil when no line does.
func lineValue(data []byte, key string) []byte {
	for i := 0; i < len(data); {
		end := bytes.IndexByte(data[i:], '\n')
		if end < 0 {
			end = len(data) - i
		}
		line := data[i : i+end]
		if bytes.HasPrefix(line, []byte(key)) {
			return line[len(key):]
		}
		i += end + 1
	}
	return nil
}

// parseCmdline splits /proc/<pid>/cmdline at NULs. Empty for kernel threads
// and zombies.
func parseCmdline(data []byte) []string {
	data = bytes.TrimRight(data, "\x00")
	if len(data) == 0 {
		return nil
	}
	parts := bytes.Split(data, []byte{0})
	argv := make([]string, len(parts))
	for i, p := range parts {
		argv[i] = string(p)
	}
	return argv
}

// environValue returns the value of key in /proc/<pid>/environ (NUL
// separated KEY=VALUE), and whether it is set.
func environValue(data []byte, key string) (string, bool) {
	prefix := []byte(key + "=")
	for len(data) > 0 {
		end := bytes.IndexByte(data, 0)
		if end < 0 {
			end = len(data)
		}
		if bytes.HasPrefix(data[:end], prefix) {
			return string(data[len(prefix):end]), true
		}
		if end == len(data) {
			break
		}
		data = data[end+1:]
	}
	return "", false
}

// Listener is one TCP socket in LISTEN state: its local address, inode,
// and the uid that owns it (the kernel's record: the effective uid of the
// process that made the socket).
type Listener struct {
	IP    net.IP
	Inode uint64
	UID   uint32
}

// parseNetTCP adds the listening sockets (state 0A) of /proc/net/tcp or tcp6
// to into, by port, in file order.
func parseNetTCP(data []byte, into map[int][]Listener) error {
	lines := bytes.Split(data, []byte{'\n'})
	if len(lines) == 0 || !bytes.Contains(lines[0], []byte("local_address")) {
		return errors.New("net/tcp: no header line")
	}
	for n, line := range lines[1:] {
		// Most lines are connections (TIME_WAIT piles up by thousands):
		// look at the state column before splitting the line.
		if st, ok := fourthField(line); ok && !bytes.Equal(st, []byte("0A")) {
			continue
		}
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 {
			return fmt.Errorf("net/tcp line %d: %d fields, want at least 10", n+2, len(f))
		}
		if string(f[3]) != "0A" {
			continue
		}
		colon := bytes.LastIndexByte(f[1], ':')
		if colon < 0 {
			return fmt.Errorf("net/tcp line %d: local address %q", n+2, f[1])
		}
		ip, err := parseHexIP(f[1][:colon])
		if err != nil {
			return fmt.Errorf("net/tcp line %d: local address: %w", n+2, err)
		}
		port, err := strconv.ParseUint(string(f[1][colon+1:]), 16, 16)
		if err != nil {
			return fmt.Errorf("net/tcp line %d: port: %w", n+2, err)
		}
		uid, err := strconv.ParseUint(string(f[7]), 10, 32)
		if err != nil {
			return fmt.Errorf("net/tcp line %d: uid: %w", n+2, err)
		}
		inode, err := strconv.ParseUint(string(f[9]), 10, 64)
		if err != nil {
			return fmt.Errorf("net/tcp line %d: inode: %w", n+2, err)
		}
		if inode != 0 {
			into[int(port)] = append(into[int(port)], Listener{IP: ip, Inode: inode, UID: uint32(uid)})
		}
	}
	return nil
}

// parseHexIP decodes /proc/net/tcp's address: 8 hex digits (IPv4) or 32
// (IPv6), each 32-bit word in the host's byte order (little-endian on every
// platform gpumem runs on).
func parseHexIP(h []byte) (net.IP, error) {
	if len(h) != 8 && len(h) != 32 {
		return nil, fmt.Errorf("%q is not 8 or 32 hex digits", h)
	}
	raw := make([]byte, len(h)/2)
	if _, err := hex.Decode(raw, h); err != nil {
		return nil, fmt.Errorf("%q: %w", h, err)
	}
	ip := make(net.IP, len(raw))
	for w := 0; w < len(raw); w += 4 {
		ip[w], ip[w+1], ip[w+2], ip[w+3] = raw[w+3], raw[w+2], raw[w+1], raw[w]
	}
	return ip, nil
}

// parseSocketLink returns N from a /proc/<pid>/fd link "socket:[N]".
func parseSocketLink(link string) (uint64, bool) {
	const prefix, suffix = "socket:[", "]"
	if len(link) <= len(prefix)+len(suffix) || link[:len(prefix)] != prefix || link[len(link)-1] != ']' {
		return 0, false
	}
	inode, err := strconv.ParseUint(link[len(prefix):len(link)-1], 10, 64)
	return inode, err == nil
}

// fourthField returns the fourth space-separated field of line (the state
// column of /proc/net/tcp) without allocating.
func fourthField(line []byte) ([]byte, bool) {
	field := 0
	i := 0
	for i < len(line) {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		start := i
		for i < len(line) && line[i] != ' ' {
			i++
		}
		if start == i {
			break
		}
		if field == 3 {
			return line[start:i], true
		}
		field++
	}
	return nil, false
}
