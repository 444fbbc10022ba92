package testenv

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the times in /proc/<pid>/stat. Linux fixes it at
// 100 for user space on every architecture gpumem runs on (`getconf
// CLK_TCK`), whatever the kernel's own HZ.
const userHZ = 100

// ProcCPU is the CPU time (user + system) that pid has used so far, from
// /proc/<pid>/stat, in steps of 10 ms.
func ProcCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(data)
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line; comm (field 2) may hold spaces and ')'.
func parseStatCPU(data []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no ')' after comm", data)
	}
	// After ") ": field 3 (state) is index 0, so utime (14) is index 11.
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after comm, want at least 13", data, len(fields))
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: cpu time %q: %w", f, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// ProcRunTime is the time pid's threads have spent on a CPU, summed over
// /proc/<pid>/task/*/schedstat (nanoseconds, from the scheduler). Unlike
// ProcCPU, which the kernel samples at each tick (4 ms at HZ=250, and a
// process that wakes for a millisecond now and then is charged a whole
// tick or nothing), it is exact; it misses threads that have exited.
func ProcRunTime(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*/schedstat", pid))
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, fmt.Errorf("pid %d: no tasks (gone?)", pid)
	}
	var total time.Duration
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread exited meanwhile
		}
		ns, err := parseSchedstat(data)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", t, err)
		}
		total += ns
	}
	return total, nil
}

// parseSchedstat reads the first field of a schedstat line: time on CPU in
// nanoseconds.
func parseSchedstat(data []byte) (time.Duration, error) {
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0, fmt.Errorf("schedstat %q: empty", data)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat %q: %w", data, err)
	}
	return time.Duration(ns), nil
}

// ProcMemory returns pid's resident set now (VmRSS) and its peak (VmHWM),
// in bytes, from /proc/<pid>/status.
func ProcMemory(pid int) (rss, peak uint64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStatusMemory(data)
}

func parseStatusMemory(data []byte) (rss, peak uint64, err error) {
	found := 0
	for _, line := range strings.Split(string(data), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || (name != "VmRSS" && name != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("status: %s %q: %w", name, value, err)
		}
		if name == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("status: VmRSS or VmHWM missing (a kernel thread, or a zombie?)")
	}
	return rss, peak, nil
}

// LoadAverage is the 1-minute load average from /proc/loadavg (0 if it
// cannot be read: it only annotates results).
func LoadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// KernelPIDs returns the live processes started as a kernel on connFile:
// those whose argv has "-f connFile" (a frontend that merely names the file
// does not count). More than one while a restarted kernel's old process is
// still exiting.
func KernelPIDs(connFile string) []int {
	var pids []int
	for _, p := range ProcessesWithArg(func(argv []string) bool {
		for i := 1; i < len(argv); i++ {
			if argv[i] == connFile && (argv[i-1] == "-f" || argv[i-1] == "--f") {
				return true
			}
			if argv[i] == "-f="+connFile || argv[i] == "--f="+connFile {
				return true
			}
		}
		return false
	}) {
		if Alive(p) {
			pids = append(pids, p)
		}
	}
	return pids
}

// ProcessesWithArg returns the pids of processes whose argv match says yes
// to (processes that vanish while being read are skipped).
func ProcessesWithArg(match func(argv []string) bool) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, dir := range dirs {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Alive reports whether pid names a process that has not exited (neither
// gone nor a zombie awaiting its parent's wait).
func Alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && i+2 < len(data) && data[i+2] != 'Z' && data[i+2] != 'X'
}
