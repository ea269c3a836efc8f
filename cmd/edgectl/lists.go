package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeguard/edgeguard/internal/control"
	"github.com/edgeguard/edgeguard/internal/policy"
)

func newListCommand(kind control.ListKind) *cobra.Command {
	verb := map[control.ListKind]string{control.Deny: "drop", control.Allow: "pass without limits"}[kind]
	cmd := &cobra.Command{
		Use:   string(kind),
		Short: fmt.Sprintf("Change the %s list on the running daemon (%s)", kind, verb),
	}
	groupCommand(cmd)
	var ttl time.Duration
	var reason string
	var force bool
	add := &cobra.Command{
		Use:   "add PREFIX",
		Short: fmt.Sprintf("Add an address or prefix to the %s list, at once, until removed or --ttl passes", kind),
		Long: fmt.Sprintf(`Add an address or CIDR to the %s list of the running daemon (%s). It takes effect at
once and lasts until 'edgectl %s remove', or until --ttl passes (a temporary entry expires
by itself). Deny wins over allow when both cover a source. Entries added here live in the daemon, not in the policy file: the daemon keeps
them in its state directory (--state-dir, default /var/lib/edgeguard), so a restart or a
reboot keeps them; 'edgectl detach --unpin' does not remove them. Put permanent entries in
the policy file.

Prefixes wider than an IPv4 /16 or an IPv6 /32 are refused without --force, and so are deny
entries overlapping the policy's lists.protected prefixes (your own networks, monitoring,
upstream resolvers: L7 escalation never denies those either). Adding an entry that exists
refreshes it (its new --ttl counts from now) and keeps its reason unless --reason is given.

When the state directory cannot be written (full, read-only), the entry is in force in the
data plane at once but not saved: the command says so and exits 1, 'edgectl status' shows
"state NOT SAVED" and edgeguard_state_unsaved is 1 until a later save succeeds (the daemon
retries every 10 s). A removal that cannot be saved is reported the same way.`, kind, verb, kind),
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := policy.ParsePrefix(args[0])
			if err != nil {
				return usageError{fmt.Errorf("bad prefix %q: %w", args[0], err)}
			}
			if cmd.Flags().Changed("ttl") && ttl <= 0 {
				return usageError{fmt.Errorf("--ttl %v: a TTL must be positive; leave --ttl out for an entry that lasts until removed", ttl)}
			}
			e, err := newClient(cmd).AddToList(cmd.Context(), kind, control.ListChange{Prefix: p, TTL: control.Duration(ttl), Reason: reason, Force: force})
			if err != nil {
				return err
			}
			until := "until removed"
			if e.Expires != nil {
				until = "until " + e.Expires.Format(time.RFC3339)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s\n", kind, e.Prefix, until)
			if e.NotSaved != "" {
				return exitError{code: 1, err: fmt.Errorf("%s %s is in force in the data plane, but NOT saved (%s): "+
					"a restart forgets it; the daemon retries the save every 10 s (edgectl status shows it)", kind, e.Prefix, e.NotSaved)}
			}
			return nil
		},
	}
	add.Flags().DurationVar(&ttl, "ttl", 0, "remove the entry by itself after this long (e.g. 10m, 24h); left out: until removed")
	add.Flags().StringVar(&reason, "reason", "", "why (shown by list and logged); re-adding an entry without --reason keeps its reason")
	add.Flags().BoolVar(&force, "force", false, "add a prefix wider than IPv4 /16 or IPv6 /32, or (deny) one overlapping the policy's lists.protected")
	remove := &cobra.Command{
		Use:   "remove PREFIX",
		Short: fmt.Sprintf("Remove an entry added with '%s add'", kind),
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := policy.ParsePrefix(args[0]); err != nil {
				return usageError{fmt.Errorf("bad prefix %q: %w", args[0], err)}
			}
			e, err := newClient(cmd).RemoveFromList(cmd.Context(), kind, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s from the %s list\n", args[0], kind)
			if e.NotSaved != "" {
				return exitError{code: 1, err: fmt.Errorf("%s removed from the data plane, but the removal is NOT saved (%s): "+
					"a restart brings it back; the daemon retries the save every 10 s (edgectl status shows it)", args[0], e.NotSaved)}
			}
			return nil
		},
	}
	list := &cobra.Command{
		Use:   "list",
		Short: fmt.Sprintf("Show the %s list: the policy's entries and those added at run time", kind),
		Args:  cobra.NoArgs,
	}
	asJSON := addOutputFlags(list)
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		json, err := asJSON()
		if err != nil {
			return err
		}
		entries, err := newClient(cmd).List(cmd.Context(), kind)
		if err != nil {
			return err
		}
		if json {
			if entries == nil {
				entries = []control.ListEntry{}
			}
			return printJSON(cmd.OutOrStdout(), entries)
		}
		w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintf(w, "PREFIX\tORIGIN\tEXPIRES\tREASON\n")
		for _, e := range entries {
			exp := "never"
			if e.Expires != nil {
				exp = e.Expires.Format(time.RFC3339)
			}
			origin := e.Origin
			if e.Host != "" {
				origin += " (" + e.Host + ")"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", e.Prefix, origin, exp, e.Reason)
		}
		return w.Flush()
	}
	cmd.AddCommand(add, remove, list)
	return cmd
}
