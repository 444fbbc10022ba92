// Command gpumem shows and frees GPU memory by Jupyter notebook.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpumem/gpumem/cmd/gpumem/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// GPUMEM_PROC_ROOT: the host's /proc mounted in a container (see README).
	code := cli.Run(ctx, os.Args[1:], cli.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
		ProcRoot: os.Getenv("GPUMEM_PROC_ROOT")})
	stop()
	os.Exit(code)
}
