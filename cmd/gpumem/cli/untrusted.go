package cli

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/internal/textsafe"
	"github.com/gpumem/gpumem/sidecar/api"
)

// A socket that root or the user does not serve is never used (the api
// package's Client refuses it on every connection): whoever serves it
// writes the figures and the alerts' text. A command that has a standalone
// way says so in one line and takes it; one that has none exits 2 with
// that line (Run).

// untrustedLine is err's one line when err is a refused socket: "gpumem: not
// using PATH: ...". ok is false for any other error.
func untrustedLine(err error) (line string, ok bool) {
	var ue *api.UntrustedError
	if !errors.As(err, &ue) {
		return "", false
	}
	return "gpumem: " + textsafe.Line(ue.Error()), true
}

// warnUntrusted writes err's line to stderr when it is a refused socket
// and reports whether it was one: the caller then goes standalone.
func warnUntrusted(env Env, err error) bool {
	line, ok := untrustedLine(err)
	if ok {
		fmt.Fprintln(env.Stderr, line)
	}
	return ok
}
