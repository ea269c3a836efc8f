// Command l7proxy runs the L7 reverse proxy (internal/l7/proxy) from the l7:
// section of a YAML file, as the daemon does; bench/l7.sh uses it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"go.yaml.in/yaml/v3"

	"github.com/edgeguard/edgeguard/internal/l7/proxy"
)

func main() {
	path := flag.String("config", "", "YAML file with an l7: section")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile here until exit")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "l7proxy:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "l7proxy:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if err := run(*path, log); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "l7proxy:", err)
		os.Exit(1)
	}
}

func run(path string, log *slog.Logger) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	var node *yaml.Node
	if len(doc.Content) > 0 {
		root := doc.Content[0]
		for i := 0; i+1 < len(root.Content); i += 2 {
			if root.Content[i].Value == "l7" {
				node = root.Content[i+1]
			}
		}
	}
	cfg, probs := proxy.Decode(node, path)
	if len(probs) > 0 {
		for _, p := range probs {
			fmt.Fprintln(os.Stderr, p)
		}
		return fmt.Errorf("%s: %d problems", path, len(probs))
	}
	p, err := proxy.New(cfg, proxy.Options{Logger: log})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return p.Serve(ctx)
}
