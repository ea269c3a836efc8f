// Package examples holds the example policy, which is also the daemon's
// built-in default.
package examples

import (
	"bytes"
	_ "embed"
)

//go:embed edgeguard.yaml
var defaultPolicy []byte

// DefaultPolicyName names the built-in policy in messages.
const DefaultPolicyName = "built-in:examples/edgeguard.yaml"

// DefaultPolicy returns the bytes of examples/edgeguard.yaml.
func DefaultPolicy() []byte { return bytes.Clone(defaultPolicy) }
