package policy

import (
	"fmt"
	"os"
)

// Load reads and validates the policy file at path, as the daemon does
// (internal/daemon reads the file itself: it reports L7 problems against
// the raw bytes).
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	return Parse(path, data, os.ReadFile)
}
