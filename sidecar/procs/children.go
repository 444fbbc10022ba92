package procs

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// ChildrenOf lists the pids whose parent is pid, sorted: from
// /proc/<pid>/task/*/children (one small read per thread of pid), else, on
// a kernel built without CONFIG_PROC_CHILDREN, from the stat of every
// process. A pid that is gone is an error wrapping io/fs.ErrNotExist.
func (fs *FS) ChildrenOf(pid int) ([]int, error) {
	tasks, err := os.ReadDir(filepath.Join(fs.root(), strconv.Itoa(pid), "task"))
	if err != nil {
		return nil, fmt.Errorf("children of pid %d: %w", pid, err)
	}
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join(fs.root(), strconv.Itoa(pid), "task", t.Name(), "children"))
		switch {
		case errors.Is(err, iofs.ErrNotExist) && t.Name() == strconv.Itoa(pid):
			return fs.childrenByScan(pid)
		case err != nil:
			continue // a thread that just ended
		}
		pids, err := parseChildren(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(fs.root(), strconv.Itoa(pid), "task", t.Name(), "children"), err)
		}
		out = append(out, pids...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (fs *FS) childrenByScan(pid int) ([]int, error) {
	t, err := fs.ScanTree(nil)
	if err != nil {
		return nil, err
	}
	var out []int
	for _, p := range t.Children(pid) {
		out = append(out, p.PID)
	}
	slices.Sort(out)
	return out, nil
}

// parseChildren parses a task's children file: pids separated by spaces.
func parseChildren(data []byte) ([]int, error) {
	var out []int
	for i := 0; i < len(data); {
		for i < len(data) && (data[i] == ' ' || data[i] == '\n') {
			i++
		}
		j := i
		for j < len(data) && data[j] != ' ' && data[j] != '\n' {
			j++
		}
		if j == i {
			break
		}
		n, err := atoi(data[i:j])
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("not a pid: %q", data[i:j])
		}
		out = append(out, n)
		i = j
	}
	return out, nil
}
