// Command progstat loads the committed BPF objects the way the daemon does
// (internal/loader, default table sizes, no pins) and prints one line per
// program with what the verifier made of it: the object's instruction
// count, the translated (xlated) count, the instructions the verifier
// processed, and the JIT image size. The SYN path's object is loaded after
// the limiter, as the daemon loads it: only when loader.ProbeSyn passes; on
// a kernel without what it needs, its line says result=unavailable and why
// (that is not a failure: the daemon runs without it there). A program the
// kernel refuses prints the verifier's log and makes the exit status 1.
// scripts/kernel-matrix.sh runs it inside each kernel of the matrix.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

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
		rejected(prefix, "limiter", err)
		return fmt.Errorf("load limiter: %w", err)
	}
	defer dp.Close()
	if err := report(prefix, "limiter", spec, map[string]*ebpf.Program{"xdp_limiter": dp.Objects.XdpLimiter}); err != nil {
		return err
	}

	synSpec, err := loader.LoadSyncookie()
	if err != nil {
		return fmt.Errorf("parse syn object: %w", err)
	}
	syn, err := loader.LoadSyn(dp, loader.SynOptions{Logger: slog.New(slog.DiscardHandler)})
	if errors.Is(err, loader.ErrSynUnavailable) {
		// The reason on a line of its own (it has spaces).
		fmt.Printf("%s verifier object=syncookie result=unavailable\n", prefix)
		fmt.Printf("%s verifier-why %s\n", prefix, strings.TrimPrefix(err.Error(), loader.ErrSynUnavailable.Error()+": "))
		return nil
	}
	if err != nil {
		rejected(prefix, "syncookie", err)
		return fmt.Errorf("load syn path: %w", err)
	}
	defer syn.Close()
	return report(prefix, "syncookie", synSpec, map[string]*ebpf.Program{
		"eg_syn_xdp": syn.Objects.EgSynXdp, "eg_syn_tc": syn.Objects.EgSynTc,
	})
}

func rejected(prefix, object string, err error) {
	fmt.Printf("%s verifier object=%s result=rejected\n", prefix, object)
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		for _, l := range ve.Log {
			fmt.Printf("%s verifier-log %s\n", prefix, l)
		}
	} else {
		fmt.Printf("%s verifier-log %v\n", prefix, err)
	}
}

// report prints one line per program, in the order given by names.
func report(prefix, object string, spec *ebpf.CollectionSpec, progs map[string]*ebpf.Program) error {
	names := make([]string, 0, len(progs))
	for name := range progs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p := progs[name]
		ps, ok := spec.Programs[name]
		if !ok {
			return fmt.Errorf("object %s has no program %s", object, name)
		}
		// Instruction slots, as the kernel counts them (a 64-bit load
		// takes two).
		line := fmt.Sprintf("%s verifier object=%s program=%s result=accepted insns=%d", prefix, object, name,
			ps.Instructions.Size()/asm.InstructionSize)
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
