package main

import (
	"fmt"
	"os/exec"
	"strings"

	"github.com/edgeguard/edgeguard/internal/testbed"
)

// nsExec runs a command inside the namespace with "ip netns exec" (which
// also mounts the namespace's own /sys, for nft, iptables, ethtool and the
// threaded-NAPI switch), bounded by timeout(1).
func nsExec(ns *testbed.Namespace, stdin string, args ...string) (string, error) {
	full := append([]string{"10", "ip", "netns", "exec", ns.Name}, args...)
	cmd := exec.Command("timeout", full...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s in %s: %w: %s", strings.Join(args, " "), ns.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
