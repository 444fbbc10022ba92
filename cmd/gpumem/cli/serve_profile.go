package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"

	"github.com/rs/zerolog"
)

// writeHeap writes the heap's profile, after a GC, to path.
func writeHeap(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = pprof.WriteHeapProfile(f)
	return errors.Join(err, f.Close())
}

// profileWindow serves benchmarks that profile the daemon in a steady
// state, without its start in the profile: with GPUMEM_PROFILE_DIR naming a
// dir, SIGUSR1 writes the heap's profile into dir/heap-start.pprof and
// starts a CPU profile into dir/cpu.pprof; SIGUSR2 stops it and writes the
// heap's again into dir/heap.pprof (each after a GC). Without it the
// signals keep their default meaning. It ends with ctx.
func profileWindow(ctx context.Context, env Env, log zerolog.Logger) {
	dir := env.getenv("GPUMEM_PROFILE_DIR")
	if dir == "" {
		return
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		defer signal.Stop(sig)
		var cpu *os.File
		for {
			select {
			case <-ctx.Done():
				if cpu != nil {
					pprof.StopCPUProfile()
					cpu.Close()
				}
				return
			case s := <-sig:
				switch {
				case s == syscall.SIGUSR1 && cpu == nil:
					// The heap at the start too: the difference is what the
					// window allocated (pprof -base).
					writeHeap(filepath.Join(dir, "heap-start.pprof"))
					f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
					if err == nil {
						if err = pprof.StartCPUProfile(f); err != nil {
							f.Close()
						} else {
							cpu = f
						}
					}
					log.Info().Err(err).Str("dir", dir).Msg("CPU profile started")
				case s == syscall.SIGUSR2 && cpu != nil:
					pprof.StopCPUProfile()
					cerr := cpu.Close()
					cpu = nil
					err := errors.Join(cerr, writeHeap(filepath.Join(dir, "heap.pprof")))
					log.Info().Err(err).Str("dir", dir).Msg("CPU profile stopped, heap profile written")
				}
			}
		}
	}()
}
