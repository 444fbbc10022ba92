package cli

import (
	"context"
	"encoding/json"

	"github.com/gpumem/gpumem/magics"
)

// runInjectCell prints, as JSON, the silent cell that injects the magics
// (magics.InjectCell with no daemon's socket: code, expr, nonce,
// version), for the GPU host's check of the magics, which drives kernels
// through jupyter_client and an in-process IPython shell: it runs the
// binary's own cell rather than a copy of its wire format. Hidden from
// the usage: it is no user's tool.
func runInjectCell(_ context.Context, env Env, args []string) error {
	fs := newFlagSet(env, "inject-cell", "\n\nPrints {\"code\", \"expr\", \"nonce\", \"version\"}: the cell that injects the magics, with no daemon's socket.")
	rest, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(fs, rest); err != nil {
		return err
	}
	cell, err := magics.InjectCell(magics.InjectOptions{})
	if err != nil {
		return err
	}
	return json.NewEncoder(env.Stdout).Encode(cell)
}
