// Command progstat loads the committed BPF objects the way the daemon does
// (internal/loader, default table sizes, no pins) and prints one line per
// program with what the verifier made of it: the object's instruction
// count, the translated (xlated) count, the instructions the verifier
// processed, and the JIT image size. A program the kernel refuses prints
// the verifier's log and makes the exit status 1. scripts/kernel-matrix.sh
// runs it inside each kernel of the matrix.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/rlimit"

	"github.com/edgeguard/edgeguard/internal/loader"
)

func main() {
	prefix := flag.String("prefix", "EGKM", "first word of every output line (the matrix script greps for it)")
	flag.Parse()
	if err := run(*prefix); err != nil {
		fmt.Fprintf(os.Stderr, "progstat: %v\n", err)
		os.Exit(1)
	}
}

func run(prefix string) error {
	// Kernels before 5.11 charge maps to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("lift memlock limit: %w", err)
	}
	spec, err := loader.Spec(loader.DefaultSizes(), false)
	if err != nil {
		return err
	}
	dp, err := loader.Load(loader.Options{Sizes: loader.DefaultSizes(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Printf("%s verifier object=limiter result=rejected\n", prefix)
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			for _, l := range ve.Log {
				fmt.Printf("%s verifier-log %s\n", prefix, l)
			}
		} else {
			fmt.Printf("%s verifier-log %v\n", prefix, err)
		}
		return fmt.Errorf("load limiter: %w", err)
	}
	defer dp.Close()
	progs := map[string]*ebpf.Program{"xdp_limiter": dp.Objects.XdpLimiter}
	for name, p := range progs {
		// Instruction slots, as the kernel counts them (a 64-bit load
		// takes two).
		line := fmt.Sprintf("%s verifier object=limiter program=%s result=accepted insns=%d", prefix, name,
			spec.Programs[name].Instructions.Size()/asm.InstructionSize)
		info, err := p.Info()
		if err != nil {
			return fmt.Errorf("program %s info: %w", name, err)
		}
		if n, err := info.TranslatedSize(); err == nil {
			line += fmt.Sprintf(" xlated=%d", n/8)
		}
		if n, ok := info.VerifiedInstructions(); ok {
			line += fmt.Sprintf(" verified=%d", n)
		}
		if n, err := info.JitedSize(); err == nil {
			line += fmt.Sprintf(" jited_bytes=%d", n)
		}
		fmt.Println(line)
	}
	return nil
}
