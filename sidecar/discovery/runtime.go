package discovery

import (
	"os"
	"path/filepath"
)

// defaultRuntimeDir is where Jupyter writes connection and server files for
// the current user: $JUPYTER_RUNTIME_DIR, else $XDG_DATA_HOME/jupyter/runtime,
// else ~/.local/share/jupyter/runtime. getenv is os.Getenv in production.
func defaultRuntimeDir(getenv func(string) string) string {
	if d := getenv("JUPYTER_RUNTIME_DIR"); d != "" {
		return d
	}
	if d := getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "jupyter", "runtime")
	}
	home := getenv("HOME")
	if home == "" {
		if h, err := os.UserHomeDir(); err == nil {
			home = h
		}
	}
	return filepath.Join(home, ".local", "share", "jupyter", "runtime")
}

// RuntimeDirs returns the default runtime dir followed by extra dirs, cleaned
// and without duplicates.
func RuntimeDirs(getenv func(string) string, extra []string) []string {
	seen := map[string]bool{}
	var dirs []string
	for _, d := range append([]string{defaultRuntimeDir(getenv)}, extra...) {
		if d == "" {
			continue
		}
		if abs, err := filepath.Abs(d); err == nil {
			d = abs
		}
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	return dirs
}
