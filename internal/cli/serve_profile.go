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

// profileWindow serves benchmarks that profile the daemon in a steady
// state, without its start in the profile: with GPUMEM_PROFILE_DIR naming a
// dir, SIGUSR1 starts a CPU profile into dir/cpu.pprof and SIGUSR2 stops it
// and writes the heap's (after a GC) into dir/heap.pprof. Without it the
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
					runtime.GC()
					f, err := os.Create(filepath.Join(dir, "heap.pprof"))
					if err == nil {
						err = pprof.WriteHeapProfile(f)
						f.Close()
					}
					err = errors.Join(cerr, err)
					log.Info().Err(err).Str("dir", dir).Msg("CPU profile stopped, heap profile written")
				}
			}
		}
	}()
}
