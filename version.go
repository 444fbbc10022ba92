// Package gpumem holds what every part of gpumem shares about its build:
// the version number and the commit. The number is written in one place,
// labextension/package.json: the npm package, the Python wheel (hatch reads
// it there) and this binary (embedded here) all carry it. The commit is
// given by the build (-ldflags -X), else read from Go's VCS stamp.
//
// It must not import any other gpumem package: every part may import it.
package gpumem

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"sync"
)

//go:embed labextension/package.json
var packageJSON []byte

// commit is set by scripts/build-wheels.sh with
// -ldflags "-X github.com/gpumem/gpumem.commit=<sha>", because a
// reproducible build turns off Go's VCS stamp (-buildvcs=false).
var commit string

// Build is the version of this binary.
type Build struct {
	Version string `json:"version"`
	Commit  string `json:"commit"`
}

// String is what `gpumem version` prints: "gpumem 0.1.0 (commit 1a2b3c4d5e6f)".
func (b Build) String() string {
	return fmt.Sprintf("gpumem %s (commit %s)", b.Version, b.Commit)
}

// Current is this binary's version and commit.
var Current = sync.OnceValue(func() Build {
	return Build{Version: parseVersion(packageJSON), Commit: commitOf(commit, buildSettings())}
})

// parseVersion reads package.json's "version". The file is part of the
// source tree, so a bad one is a build defect: it shows as "unknown" rather
// than stopping every command.
func parseVersion(pkg []byte) string {
	var p struct {
		Version string `json:"version"`
	}
	if json.Unmarshal(pkg, &p) != nil || p.Version == "" {
		return "unknown"
	}
	return p.Version
}

func buildSettings() map[string]string {
	out := map[string]string{}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			out[s.Key] = s.Value
		}
	}
	return out
}

// commitOf is the commit given at build time, else Go's VCS stamp
// (vcs.revision, "-dirty" when vcs.modified), else "unknown". Twelve hex
// digits, as git's short form that stays unique in a large history.
func commitOf(given string, settings map[string]string) string {
	if given != "" {
		return given
	}
	rev := settings["vcs.revision"]
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if settings["vcs.modified"] == "true" {
		rev += "-dirty"
	}
	return rev
}
