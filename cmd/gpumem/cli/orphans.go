package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/internal/units"
	"github.com/gpumem/gpumem/sidecar/api"
	"github.com/gpumem/gpumem/sidecar/attribution"
)

// runFreeOrphans is `gpumem free KERNEL --orphans [--pid N]`: it ends,
// through the daemon, the processes reclaim left running for KERNEL (a
// kernel id or prefix, or a notebook path or suffix, as the daemon's list
// names them: the kernel may be shut down since). The daemon checks each as
// reclaim does and the caller as the API does (the notebook's user or
// root); only it knows what it left running.
func runFreeOrphans(ctx context.Context, env Env, dirs []string, arg string, pids []int, asJSON bool) error {
	sock := daemonSocket(env, dirs)
	if sock == "" {
		return fmt.Errorf("free --orphans needs gpumem serve: only the daemon knows which processes it left running (no socket found; start gpumem serve, or set GPUMEM_SOCKET)")
	}
	c := api.NewClient(sock)
	defer c.Close()
	rep, err := c.Notebooks(ctx)
	if err != nil {
		return fmt.Errorf("free --orphans: %w", err)
	}
	kernelID, err := matchLeftRunning(rep.LeftRunning, arg)
	if err != nil {
		return err
	}
	reply, err := c.EndOrphans(ctx, kernelID, api.EndOrphansRequest{PIDs: pids})
	if err != nil {
		return fmt.Errorf("kernel %s: %w", orDash(kernelID), err)
	}
	if asJSON {
		return writeJSON(env.Stdout, reply)
	}
	failed := 0
	for _, p := range reply.Processes {
		switch {
		case p.Ended && p.Killed:
			fmt.Fprintf(env.Stdout, "pid %d: ended (it ignored SIGTERM: killed), %s freed\n", p.PID, units.Bytes(p.Bytes))
		case p.Ended:
			fmt.Fprintf(env.Stdout, "pid %d: ended, %s freed\n", p.PID, units.Bytes(p.Bytes))
		default:
			failed++
			fmt.Fprintf(env.Stdout, "pid %d: not ended: %s\n", p.PID, textsafe.Line(p.Reason))
		}
	}
	if failed > 0 {
		return fmt.Errorf("kernel %s: %d of %d processes not ended", orDash(kernelID), failed, len(reply.Processes))
	}
	return nil
}

// parsePIDs parses --pid's comma-separated list ("" is none).
func parsePIDs(s string) ([]int, error) {
	var pids []int
	for _, f := range splitList(s) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("--pid: %q is not a process id", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// matchLeftRunning finds the one kernel arg names among those with
// processes left running.
func matchLeftRunning(left []attribution.LeftRunning, arg string) (string, error) {
	notebooks := map[string]string{}
	for _, lr := range left {
		notebooks[lr.KernelID] = lr.Notebook
	}
	var matches []string
	for id, nb := range notebooks {
		if id == arg {
			return id, nil
		}
		if strings.HasPrefix(id, arg) || (nb != "" && (nb == arg || strings.HasSuffix(nb, string(filepath.Separator)+arg))) {
			matches = append(matches, id)
		}
	}
	sort.Strings(matches)
	list := func(ids []string) string {
		var lines []string
		for _, id := range ids {
			lines = append(lines, fmt.Sprintf("  %s  %s", orDash(id), orDash(notebooks[id])))
		}
		sort.Strings(lines)
		return strings.Join(lines, "\n")
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		if len(notebooks) == 0 {
			return "", errors.New("gpumem serve left no process running: nothing to end")
		}
		ids := make([]string, 0, len(notebooks))
		for id := range notebooks {
			ids = append(ids, id)
		}
		return "", fmt.Errorf("no kernel with processes left running matches %q; those with some:\n%s", arg, list(ids))
	}
	return "", fmt.Errorf("%q matches %d kernels with processes left running; use more of the id:\n%s", arg, len(matches), list(matches))
}
