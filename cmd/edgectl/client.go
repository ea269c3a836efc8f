package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func newClient(cmd *cobra.Command) *control.Client {
	socket, _ := cmd.Flags().GetString("socket")
	return control.NewClient(socket)
}

func addJSONFlag(cmd *cobra.Command) *bool {
	return cmd.Flags().Bool("json", false, "print JSON instead of a table")
}

// addOutputFlags gives a command --json and its long form -o/--output
// table|json (as explain and shield have); the returned function says
// whether JSON was asked for, or a usage error for another format.
func addOutputFlags(cmd *cobra.Command) func() (bool, error) {
	asJSON := addJSONFlag(cmd)
	output := cmd.Flags().StringP("output", "o", "table", "output format: table or json (--json is -o json)")
	return func() (bool, error) {
		switch *output {
		case "table":
			return *asJSON, nil
		case "json":
			return true, nil
		}
		return false, usageError{fmt.Errorf("bad --output %q: use table or json", *output)}
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// asValidation turns policy problems into usage errors (exit code 2).
func asValidation(err error) error {
	var ve *policy.ValidationError
	if errors.As(err, &ve) {
		return usageError{err}
	}
	var ae *control.APIError
	if errors.As(err, &ae) && len(ae.Problems) > 0 {
		return usageError{err}
	}
	return err
}

func human(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fG", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", n/1e6)
	case n >= 1e4:
		return fmt.Sprintf("%.1fk", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}
