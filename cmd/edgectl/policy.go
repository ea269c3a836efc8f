package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/daemon"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Validate, compare, apply and show policies"}
	cmd.AddCommand(newPolicyValidate(), newPolicyDiff(), newPolicyApply(), newPolicyShow())
	return cmd
}

// compileFile validates and compiles a policy file without ASN data,
// l7: section included.
func compileFile(path string) (*policy.Compiled, error) {
	return daemon.Validate(path)
}

func newPolicyValidate() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a policy file; print every problem with file:line:column",
		Long: `Check a policy file and print every problem at once, each with file:line:column,
what is wrong and what is allowed. Exit code 0 if valid, 2 if not. It needs no daemon.
ASN data named in the file is not loaded here; the daemon loads it when applying.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := compileFile(args[0])
			if err != nil {
				return asValidation(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid: %d rules, %d prefix entries, %d list entries, %d l4 entries\n",
				args[0], len(c.Rules), len(c.Prefixes), len(c.Lists), len(c.L4))
			for _, w := range c.Warnings {
				fmt.Fprintf(cmd.OutOrStdout(), "warning: %s\n", w)
			}
			return nil
		},
	}
}

func newPolicyDiff() *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "diff FILE",
		Short: "Show what applying FILE would change in the running policy (or against --from OLD)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != "" {
				old, err := compileFile(from)
				if err != nil {
					return asValidation(err)
				}
				next, err := compileFile(args[0])
				if err != nil {
					return asValidation(err)
				}
				fmt.Fprint(cmd.OutOrStdout(), orNoChange(policy.FormatDiff(policy.Diff(old, next))))
				return nil
			}
			doc, err := readPolicyDoc(args[0])
			if err != nil {
				return err
			}
			ch, err := newClient(cmd).DiffPolicy(cmd.Context(), doc)
			if err != nil {
				return asValidation(err)
			}
			fmt.Fprint(cmd.OutOrStdout(), orNoChange(ch.Diff))
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "compare with this file instead of the running policy (no daemon needed)")
	return cmd
}

func orNoChange(diff string) string {
	if strings.TrimSpace(diff) == "" {
		return "no change\n"
	}
	if !strings.HasSuffix(diff, "\n") {
		diff += "\n"
	}
	return diff
}

func readPolicyDoc(path string) (control.PolicyDoc, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return control.PolicyDoc{}, fmt.Errorf("read policy: %w", err)
	}
	return control.PolicyDoc{Source: path, YAML: string(raw)}, nil
}

func newPolicyApply() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "apply FILE",
		Short: "Apply FILE to the running daemon: show the diff, ask, apply atomically, save it as the daemon's config",
		Long: `Validate FILE against the running daemon, show what would change and ask before applying
(--yes skips the question). The new policy takes effect atomically (packets see the old or
the new rules, never a mix), and the daemon saves it over its --config file so a restart
keeps it. A policy that does not validate changes nothing (exit code 2).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := readPolicyDoc(args[0])
			if err != nil {
				return err
			}
			c := newClient(cmd)
			ch, err := c.DiffPolicy(cmd.Context(), doc)
			if err != nil {
				return asValidation(err)
			}
			fmt.Fprint(cmd.OutOrStdout(), orNoChange(ch.Diff))
			if !yes {
				fmt.Fprint(cmd.OutOrStdout(), "apply? [y/N] ")
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					fmt.Fprintln(cmd.OutOrStdout(), "not applied")
					return nil
				}
			}
			res, err := c.ApplyPolicy(cmd.Context(), doc)
			if err != nil {
				return asValidation(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied: generation %d\n", res.Generation)
			return nil
		},
	}
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "apply without asking")
	return cmd
}

func newPolicyShow() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Print the running policy",
		Args:  cobra.NoArgs,
	}
	asJSON := addJSONFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		doc, err := newClient(cmd).Policy(cmd.Context())
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(cmd.OutOrStdout(), doc)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "# %s (generation %d)\n%s", doc.Source, doc.Generation, doc.YAML)
		return nil
	}
	return cmd
}
