package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/daemon"
	"github.com/edgeguard/edgeguard/internal/l7/rls"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Validate, compare, apply and show policies"}
	groupCommand(cmd)
	cmd.AddCommand(newPolicyValidate(), newPolicyDiff(), newPolicyApply(), newPolicyShow(), newPolicyFields())
	return cmd
}

func newPolicyFields() *cobra.Command {
	return &cobra.Command{
		Use:   "fields [SECTION]",
		Short: "Print the policy sections' fields: what each takes, its default and what it does",
		Long: `Print the field tables of the policy's sections (Markdown, as docs/policy.md has them):
each field's key, what the file may write with its bounds, its default and what it does. They
are written from the tables the parser itself walks, so they say what this edgectl accepts.
With SECTION (standing, shield, fleet.redis, "syn service", l7.timeouts, "l7 limit", ...), only
that section's table.
It needs no daemon and changes nothing.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, ft := range append(policy.FieldTables(), rls.FieldTables()...) {
				names = append(names, ft.Name)
				if len(args) == 1 && ft.Name != args[0] {
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s:\n\n%s\n", ft.Name, ft.Markdown)
				if len(args) == 1 {
					return nil
				}
			}
			if len(args) == 1 {
				return usageError{fmt.Errorf("no section %q; sections: %s", args[0], strings.Join(names, ", "))}
			}
			return nil
		},
	}
}

func newPolicyValidate() *cobra.Command {
	var noASN bool
	cmd := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a policy file; print every problem with file:line:column",
		Long: `Check a policy file and print every problem at once, each with file:line:column,
what is wrong and what is allowed. Exit code 0 if valid, 2 if not (or FILE cannot be read),
1 if a file it names (asn data) cannot be read. It needs no daemon and changes nothing.

The ASN data the file names (asn_data.path, relative to the policy file) is loaded and
compiled in, as the daemon does, so a warning that an ASN has no prefixes is about the real
data; --no-asn skips that (faster), and the output then says the data was not loaded.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(args[0]); err != nil {
				return usageError{fmt.Errorf("policy file: %w", err)}
			}
			ch, err := daemon.CheckFile(cmd.Context(), args[0], !noASN, progressBar(cmd.ErrOrStderr(), "loading asn data"))
			if err != nil {
				return asValidation(err)
			}
			c := ch.Compiled
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid: %d rules, %d prefix entries, %d list entries, %d l4 entries\n",
				args[0], len(c.Rules), len(c.Prefixes), len(c.Lists), len(c.L4))
			switch p := ch.Policy.ASNData.Path; {
			case p != "" && ch.ASNLoaded:
				fmt.Fprintf(cmd.OutOrStdout(), "asn data: %s loaded, %d ranges\n", p, ch.ASNEntries)
			case p != "":
				fmt.Fprintf(cmd.OutOrStdout(), "asn data: %s NOT loaded (--no-asn): ASN and country rules were compiled without it\n", p)
			}
			for _, w := range c.Warnings {
				fmt.Fprintf(cmd.OutOrStdout(), "warning: %s\n", w)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&noASN, "no-asn", false, "do not load the policy's asn_data (say so instead)")
	return cmd
}

func newPolicyDiff() *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "diff FILE",
		Short: "Show what applying FILE would change in the running policy (or against --from OLD)",
		Long: `Show what applying FILE would change in the running policy, or against the file --from OLD
(no daemon needed): settings, interfaces, rules, L4 entries, list entries, prefix facts and
the l7: section. Exit code as diff(1): 0 no change, 1 changes, 2 trouble (a file that does
not validate, no daemon to ask).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var diff string
			var n int
			if from != "" {
				var err error
				if diff, n, err = diffFiles(from, args[0]); err != nil {
					return exitError{2, err}
				}
			} else {
				doc, err := readPolicyDoc(args[0])
				if err != nil {
					return exitError{2, err}
				}
				ch, err := newClient(cmd).DiffPolicy(cmd.Context(), doc)
				if err != nil {
					return exitError{2, err}
				}
				diff, n = ch.Diff, ch.Changes
				if ch.Warning != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "edgectl: warning: %s\n", ch.Warning)
				}
			}
			fmt.Fprint(cmd.OutOrStdout(), orNoChange(diff))
			if n > 0 {
				return exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "compare with this file instead of the running policy (no daemon needed)")
	return cmd
}

// diffFiles is what changes from policy file a to b, and how many lines.
func diffFiles(a, b string) (string, int, error) {
	pa, ca, err := parseAndCompile(a)
	if err != nil {
		return "", 0, err
	}
	pb, cb, err := parseAndCompile(b)
	if err != nil {
		return "", 0, err
	}
	changes := append(policy.DiffSections(pa, pb, rls.DiffL7), policy.Diff(ca, cb)...)
	return policy.FormatDiff(changes), len(changes), nil
}

func parseAndCompile(path string) (*policy.Policy, *policy.Compiled, error) {
	c, err := daemon.CheckFile(context.Background(), path, false, nil)
	return c.Policy, c.Compiled, err
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

// readPolicyDoc reads a policy file for the daemon, named by its absolute
// path: the daemon resolves the file's relative paths (list files) beside
// it, whatever the daemon's working directory.
func readPolicyDoc(path string) (control.PolicyDoc, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return control.PolicyDoc{}, fmt.Errorf("read policy: %w", err)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return control.PolicyDoc{Source: path, YAML: string(raw)}, nil
}

func newPolicyApply() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "apply FILE",
		Short: "Apply FILE to the running daemon: show the diff, ask, apply all or nothing",
		Long: `Validate FILE against the running daemon, show what would change and ask before applying
(--yes skips the question; without a terminal to ask on, --yes is required). The change is
all or nothing: interfaces and the l7.listen address are checked first, and a step that fails
undoes the ones before it, so a failed apply leaves the running policy, its generation, the
interfaces and the data plane as they were. Packets see the old or the new rules, never a mix.

The daemon keeps the applied policy in its state directory (--state-dir, default
/var/lib/edgeguard), not in its --config file, which stays the operator's: a restart runs the
applied policy as long as the config file is unchanged since; once the file changes (edit,
package upgrade), the file runs again. 'edgectl status' says which one runs and why.

A daemon asked to stop (SIGTERM) while it applies finishes the change and answers first
(at most 30 s), and refuses changes asked for after the signal. If no answer arrives at all,
the command says the outcome is unknown and names the generation that ran before.

Exit code: 0 applied (or no change), 1 not applied (declined, or the daemon refused it, or
the outcome is unknown), 2 FILE does not validate or --yes is missing without a terminal.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := readPolicyDoc(args[0])
			if err != nil {
				return err
			}
			if !yes && !isTerminal(cmd.InOrStdin()) {
				return usageError{errors.New("not applied: no terminal to ask on; pass --yes to apply without asking " +
					"(policy diff shows the change first)")}
			}
			c := newClient(cmd)
			ch, err := c.DiffPolicy(cmd.Context(), doc)
			if err != nil {
				return asValidation(err)
			}
			fmt.Fprint(cmd.OutOrStdout(), orNoChange(ch.Diff))
			if ch.Warning != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "edgectl: warning: %s\n", ch.Warning)
			}
			if !yes {
				fmt.Fprint(cmd.OutOrStdout(), "apply? [y/N] ")
				answer, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
					return exitError{1, errors.New("not applied")}
				}
			}
			res, err := c.ApplyPolicy(cmd.Context(), doc)
			var apiErr *control.APIError
			if err != nil && !errors.As(err, &apiErr) && !errors.Is(err, control.ErrNotRunning) {
				// The daemon did not answer (it stopped, or the connection
				// broke): say what is known and how to learn the rest.
				return fmt.Errorf("no answer to the apply (%w): the outcome is unknown; the running generation was %d "+
					"before: 'edgectl policy show' says which policy runs now", err, ch.Generation)
			}
			if err != nil {
				return asValidation(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "applied: generation %d\n", res.Generation)
			if res.Warning != "" && res.Warning != ch.Warning {
				fmt.Fprintf(cmd.ErrOrStderr(), "edgectl: warning: %s\n", res.Warning)
			}
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
