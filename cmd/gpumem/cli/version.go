package cli

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/gpumem/gpumem"
)

// runVersion prints "gpumem 0.1.0 (commit 1a2b3c4d5e6f)", or with --json
// {"version": ..., "commit": ...}: what the server extension compares to
// tell that an upgrade replaced the binary of the daemon it started.
func runVersion(_ context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "version", "[--json]")
	asJSON := fs.Bool("json", false, "print {\"version\", \"commit\"} as JSON")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, rest); err != nil {
		return err
	}
	b := gpumem.Current()
	if *asJSON {
		return json.NewEncoder(env.Stdout).Encode(b)
	}
	_, err = fmt.Fprintln(env.Stdout, b)
	return err
}
