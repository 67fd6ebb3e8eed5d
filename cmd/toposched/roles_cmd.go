package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/authcallout"
	"github.com/toposched/toposched/internal/formats/clusterfile"
	"github.com/toposched/toposched/internal/natsflags"
)

func newRoles(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "roles",
		Short: "Issue and list the NATS credentials of toposched's users: one per service, node agent, tenant and administrator",
		Long: `Every part of toposched signs in to NATS as its own user, allowed its own
part and nothing more (docs/security.md): the services (operator, or one role
per service), an administrator (launcher), a tenant's users (tenant-<tenant>:
their tenant's jobs), a node's agent (agent-<node>: its node's reports and the
jobs it runs) and whoever pushes policies (policy-admin).

The credentials are nkey seed files, <role>.nk (mode 0600), in a directory:
toposched serve's DATA_DIR/credentials, whose seeds serve's embedded server
takes in within a second of their writing (and forgets when they are removed),
or one kept for a NATS deployment, whose users 'toposched roles conf' writes.
topoctl and the agents find their seed in TOPOSCHED_DATA_DIR/credentials
(default toposched-data) when no --nats-nkey is given.`,
		Args: cobra.NoArgs,
	}
	dir := natsflags.CredentialsDir(natsflags.DataDir())
	cmd.PersistentFlags().StringVar(&dir, "dir", dir, "the credentials directory (default: toposched serve's, DATA_DIR/credentials; env TOPOSCHED_DATA_DIR)")
	cmd.AddCommand(newRolesIssue(g, &dir), newRolesList(g, &dir), newRolesConf(g, &dir), newRolesShow(g), newRolesKubeSecrets(g))
	return cmd
}

func newRolesIssue(g *globals, dir *string) *cobra.Command {
	var agents, tenants []string
	var clusterFile string
	var services, callout bool
	cmd := &cobra.Command{
		Use:   "issue [--agent NODE]... [--tenant TENANT]... [--agents-from CLUSTER_FILE] [--services] [--auth-callout]",
		Short: "Write a seed file for each role named, and the operator's, launcher's and policy-admin's, keeping those already there",
		Example: `  toposched roles issue --agent gpu-001 --agent gpu-002 --tenant research
  toposched agent --exec --node gpu-001 --nats-nkey toposched-data/credentials/agent-gpu-001.nk
  topoctl --tenant research submit job.yaml       # signs in with tenant-research.nk
  toposched roles issue --services                # analysis.nk, placement.nk, ... for services run apart
  toposched roles issue --auth-callout            # auth-callout.nk and auth-callout-issuer.seed: agents signed in by Kubernetes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if clusterFile != "" {
				c, err := clusterfile.LoadCluster(clusterFile)
				if err != nil {
					return fmt.Errorf("--agents-from: %w", err)
				}
				for _, n := range c.Nodes {
					agents = append(agents, n.Name)
				}
			}
			wanted, err := issuedRoles(g.prefix, agents, tenants)
			if err != nil {
				return err
			}
			if services {
				wanted = append(wanted, serviceRoles(g.prefix)...)
			}
			if callout {
				wanted = append(wanted, natsserver.Role{Name: roleAuthCallout, Permissions: authCalloutPermissions()})
			}
			creds, err := natsserver.EnsureCredentials(*dir, wanted)
			if err != nil {
				return err
			}
			if err := writeRoles(cmd.OutOrStdout(), creds, creds.Roles(), creds.Created()); err != nil {
				return err
			}
			if !callout {
				return nil
			}
			file := filepath.Join(*dir, authcallout.IssuerFile)
			pub, created, err := authcallout.EnsureIssuer(file)
			if err != nil {
				return err
			}
			return writeIssuer(cmd.OutOrStdout(), file, pub, created)
		},
	}
	cmd.Flags().StringArrayVar(&agents, "agent", nil, "a node whose agent gets a role (repeatable)")
	cmd.Flags().StringArrayVar(&tenants, "tenant", nil, "a tenant whose users get a role (repeatable)")
	cmd.Flags().StringVar(&clusterFile, "agents-from", "", "a cluster file: a role for each of its nodes' agents")
	cmd.Flags().BoolVar(&services, "services", false,
		"a role for each service run on its own (analysis, placement, optimizer, discovery, kube: the Helm chart's Deployments, toposched@.service), in place of the operator's all-powerful one")
	cmd.Flags().BoolVar(&callout, "auth-callout", false,
		"the NATS auth callout's keys, for node agents that sign in with their pod's Kubernetes ServiceAccount token: the responder's user (auth-callout.nk) and the account key that signs the agents' users ("+authcallout.IssuerFile+"); both for toposched kube alone")
	return cmd
}

// writeIssuer prints the auth callout issuer's line, as writeRoles a
// role's: its public key goes into roles conf --auth-callout-issuer.
func writeIssuer(w io.Writer, file, pub string, created bool) error {
	made := ""
	if created {
		made = "  (new)"
	}
	_, err := fmt.Fprintf(w, "%-24s %-34s %s  %s%s\n", "auth-callout-issuer", "signs the agents' Kubernetes users", file, pub, made)
	return err
}

// serviceRoles are the roles of the services run apart, one each.
func serviceRoles(prefix string) []natsserver.Role {
	r := roles{prefix}
	out := make([]natsserver.Role, 0, len(serviceNames))
	for _, svc := range serviceNames {
		p, _ := r.permissions(svc)
		out = append(out, natsserver.Role{Name: svc, Permissions: p})
	}
	return out
}

// issuedRoles are the roles roles issue keeps: serve's and those named.
func issuedRoles(prefix string, agents, tenants []string) ([]natsserver.Role, error) {
	out := servedRoles(prefix)
	r := roles{prefix}
	var errs []error
	add := func(scope events.Scope) {
		role, err := scope.Role()
		if err != nil {
			errs = append(errs, err)
			return
		}
		if slices.ContainsFunc(out, func(x natsserver.Role) bool { return x.Name == role }) {
			return
		}
		p, _ := r.permissions(role)
		out = append(out, natsserver.Role{Name: role, Permissions: p})
	}
	for _, n := range agents {
		add(events.NodeScope(n))
	}
	for _, t := range tenants {
		add(events.TenantScope(t))
	}
	return out, errors.Join(errs...)
}

func newRolesList(g *globals, dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the roles of the credentials directory: who may sign in, as what",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			creds, errs := natsserver.ReadCredentials(*dir, roles{g.prefix}.permissions)
			for _, err := range errs {
				_, _ = fmt.Fprintln(cmd.ErrOrStderr(), "toposched roles list:", err) // a warning; the list follows
			}
			if creds == nil {
				return errors.Join(errs...)
			}
			if err := writeRoles(cmd.OutOrStdout(), creds, creds.Roles(), nil); err != nil {
				return err
			}
			file := filepath.Join(*dir, authcallout.IssuerFile)
			if _, err := os.Stat(file); err != nil {
				return nil // no auth callout here
			}
			pub, err := authcallout.IssuerPublicKey(file)
			if err != nil {
				return err
			}
			return writeIssuer(cmd.OutOrStdout(), file, pub, false)
		},
	}
}

// writeRoles prints a role a line: its name, what it may do, its file and
// public key, and whether it was just made.
func writeRoles(w io.Writer, creds *natsserver.Credentials, list, created []string) error {
	for _, role := range list {
		made := ""
		if slices.Contains(created, role) {
			made = "  (new)"
		}
		if _, err := fmt.Fprintf(w, "%-24s %-34s %s  %s%s\n", role, roleSummary(role), creds.File(role), creds.PublicKey(role), made); err != nil {
			return err
		}
	}
	return nil
}

// roleSummary says in a few words what a role may do.
func roleSummary(role string) string {
	switch role {
	case roleOperator:
		return "every service: everything"
	case roleLauncher:
		return "every tenant's jobs"
	case rolePolicyAdmin:
		return "policy and calibration sets"
	case roleAuthCallout:
		return "the agents' Kubernetes sign-ins"
	}
	if slices.Contains(fixedRoles, role) {
		return "the " + role + " service's events"
	}
	switch s, _ := events.ScopeOfRole(role); s.Kind {
	case events.ScopeNode:
		return "node " + s.Name + "'s agent"
	case events.ScopeTenant:
		return "tenant " + s.Name + "'s jobs"
	}
	return "?"
}

func newRolesShow(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show ROLE",
		Short: "Print a role's NATS permissions as JSON (agent-<node>, tenant-<tenant>, launcher, operator, ...)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, ok := roles{g.prefix}.permissions(args[0])
			if !ok {
				return fmt.Errorf("role %q: no such role (toposched roles --help lists them)", args[0])
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(p)
		},
	}
}

func newRolesConf(g *globals, dir *string) *cobra.Command {
	var account, issuer string
	var passwords bool
	cmd := &cobra.Command{
		Use:   "conf [--dir DIR | --passwords]",
		Short: "Print the nats-server accounts block that lets in the users of the credentials directory, each with its role's permissions",
		Long: `conf prints a nats-server configuration block (accounts, with JetStream, and
the system account): one nkey user per seed file of the credentials directory,
with its role's permissions. Include it in the servers' configuration and
reload them (nats-server --signal reload) whenever a role is issued or a seed
file removed.

With --passwords it prints the users of the roles without a name (operator,
launcher, policy-admin), signing in with a password from the server's
environment (TOPOSCHED_<ROLE>_PASSWORD): deploy/nats/auth.conf is this.
Agents and tenants need a role each, so they come only with --dir.

With --auth-callout-issuer (the public key, or the seed file, that roles issue
--auth-callout wrote) it also turns on the servers' auth callout: a client that
is none of these users (a node's agent with its pod's ServiceAccount token) is
let in or refused by toposched kube, whose user auth-callout.nk is put in an
account of its own (ACCOUNT_AUTH), so that no other user sees the agents'
tokens. The users of the directory and the system account's sign in as before,
never sent to the callout, and the block does not change when users are added,
so that the servers reload them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			w := &confWriter{w: cmd.OutOrStdout(), r: roles{g.prefix}}
			if passwords {
				if issuer != "" {
					return errors.New("--auth-callout-issuer: with --dir's nkey users only (the callout's auth users are the directory's)")
				}
				return w.passwords(account)
			}
			creds, errs := natsserver.ReadCredentials(*dir, w.r.permissions)
			for _, err := range errs {
				_, _ = fmt.Fprintln(cmd.ErrOrStderr(), "toposched roles conf:", err) // a warning; the users follow
			}
			if creds == nil {
				return errors.Join(errs...)
			}
			var pub string
			switch {
			case issuer != "":
				var err error
				if pub, err = authcallout.IssuerPublicKey(issuer); err != nil {
					return fmt.Errorf("--auth-callout-issuer: %w", err)
				}
				if creds.PublicKey(roleAuthCallout) == "" {
					return fmt.Errorf("--auth-callout-issuer: no %s%s in %s, so no one could answer the callout (toposched roles issue --auth-callout writes it)",
						roleAuthCallout, natsserver.SeedFileSuffix, *dir)
				}
			case creds.PublicKey(roleAuthCallout) != "":
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "toposched roles conf: %s%s is left out: no --auth-callout-issuer, so no auth callout (node agents signed in by Kubernetes are refused)\n",
					roleAuthCallout, natsserver.SeedFileSuffix) // a warning; the users follow
			}
			w.printf("# toposched's NATS users, one per seed file of %s\n"+
				"# (toposched roles conf --dir; write it again after toposched roles issue).\n"+
				"# The system account's password comes from the server's environment.\n\n", *dir)
			return w.nkeys(account, creds, pub)
		},
	}
	cmd.Flags().StringVar(&account, "account", "TOPOSCHED", "the account of toposched's users")
	cmd.Flags().StringVar(&issuer, "auth-callout-issuer", "",
		"turn on the NATS auth callout that signs node agents in by their Kubernetes ServiceAccount token: the issuer's public account key (A...), or its seed file ("+authcallout.IssuerFile+", toposched roles issue --auth-callout)")
	cmd.Flags().BoolVar(&passwords, "passwords", false, "users of the roles without a name by password from the server's environment, as deploy/nats/auth.conf")
	return cmd
}

// confWriter writes nats-server configuration, remembering its first
// write error.
type confWriter struct {
	w   io.Writer
	r   roles
	err error
}

func (c *confWriter) printf(format string, args ...any) {
	if c.err == nil {
		_, c.err = fmt.Fprintf(c.w, format, args...)
	}
}

// quote is a string of nats-server configuration: JSON's quoting is its.
func quote(s string) string { return strconv.Quote(s) }

// permissions writes p as a configuration value, indented by ind.
func (c *confWriter) permissions(p *server.Permissions, ind string) {
	if p == nil {
		c.printf("{publish: %s, subscribe: %s}", quote(">"), quote(">"))
		return
	}
	list := func(in, name string, subjects []string) {
		if len(subjects) == 0 {
			return
		}
		c.printf("%s%s: [\n", in, name)
		for _, s := range subjects {
			c.printf("%s  %s\n", in, quote(s))
		}
		c.printf("%s]\n", in)
	}
	side := func(name string, sp *server.SubjectPermission) {
		if sp == nil {
			return
		}
		c.printf("%s  %s: {\n", ind, name)
		list(ind+"    ", "allow", sp.Allow)
		list(ind+"    ", "deny", sp.Deny)
		c.printf("%s  }\n", ind)
	}
	c.printf("{\n")
	side("publish", p.Publish)
	side("subscribe", p.Subscribe)
	c.printf("%s}", ind)
}

// passwords writes the password users of the roles without a name.
func (c *confWriter) passwords(account string) error {
	c.printf("# toposched's NATS users by password (toposched roles conf --passwords; do not edit:\n" +
		"# TestShippedAuthConfIsGenerated keeps it equal to the command's output).\n" +
		"# Passwords come from the server's environment, never from this file:\n")
	for _, role := range []string{roleOperator, roleLauncher, rolePolicyAdmin} {
		c.printf("#   %-28s %s\n", passwordVar(role), roleSummary(role))
	}
	c.printf("#   %-28s %s\n", "NATS_SYS_PASSWORD", "the system account (monitoring, nats server ...)\n"+
		"# Node agents and tenants sign in with a role each (agent-<node>, tenant-<tenant>):\n"+
		"# issue their nkeys with toposched roles issue and write every user with\n"+
		"# toposched roles conf --dir DIR in place of this file. The subjects are toposched's\n"+
		"# default prefix; print another's with toposched --prefix P roles conf.\n")
	for _, role := range []string{roleOperator, roleLauncher, rolePolicyAdmin} {
		p, _ := c.r.permissions(role)
		c.printf("%s = ", permsVar(role))
		c.permissions(p, "")
		c.printf("\n\n")
	}
	c.printf("accounts {\n  %s {\n    jetstream: enabled\n    users: [\n", account)
	for _, role := range []string{roleOperator, roleLauncher, rolePolicyAdmin} {
		c.printf("      {user: %s, password: $%s, permissions: $%s}\n", role, passwordVar(role), permsVar(role))
	}
	c.printf("    ]\n  }\n  SYS {\n    users: [{user: sys, password: $NATS_SYS_PASSWORD}]\n  }\n}\nsystem_account: SYS\n")
	return c.err
}

// nkeys writes an nkey user for each of creds' roles. With issuer (the
// auth callout's public key) the callout's responder gets an account of
// its own and the servers' authorization block sends every other client to
// it. The caller writes the header that says where the users come from.
func (c *confWriter) nkeys(account string, creds *natsserver.Credentials, issuer string) error {
	c.printf("accounts {\n  %s {\n    jetstream: enabled\n    users: [\n", account)
	var callout string
	for _, role := range creds.Roles() {
		if role == roleAuthCallout {
			callout = role
			continue
		}
		c.user(creds, role)
	}
	c.printf("    ]\n  }\n")
	if issuer != "" {
		c.printf("  # The auth callout's own account: the servers' requests, each holding a\n"+
			"  # client's token, reach no one else.\n"+
			"  %s {\n    users: [\n", calloutAccount(account))
		c.user(creds, callout)
		c.printf("    ]\n  }\n")
	}
	c.printf("  SYS {\n    users: [{user: sys, password: $NATS_SYS_PASSWORD}]\n  }\n}\nsystem_account: SYS\n")
	if issuer == "" {
		return c.err
	}
	c.printf("\n# A client that is none of the users above (a node's agent with its pod's\n"+
		"# ServiceAccount token) is let in as its node's agent, in %s, or\n"+
		"# refused by the auth callout, toposched kube (--auth-callout-issuer-seed).\n"+
		"# No account's users are sent to it but the callout's own, whose one user\n"+
		"# is its auth user: the users above sign in as before, and a user added\n"+
		"# later changes nothing here (nats-server reloads no changed auth_callout).\n", account)
	c.printf("authorization {\n  auth_callout {\n    issuer: %s\n    account: %s\n", quote(issuer), calloutAccount(account))
	c.printf("    auth_users: [%s]\n    allowed_accounts: [%s]\n  }\n}\n", quote(creds.PublicKey(roleAuthCallout)), calloutAccount(account))
	return c.err
}

// user writes role's nkey user with its permissions.
func (c *confWriter) user(creds *natsserver.Credentials, role string) {
	p, _ := c.r.permissions(role)
	c.printf("      # %s: %s\n      {nkey: %s, permissions: ", role, roleSummary(role), quote(creds.PublicKey(role)))
	c.permissions(p, "      ")
	c.printf("}\n")
}

// calloutAccount is the auth callout responder's account.
func calloutAccount(account string) string { return account + "_AUTH" }

// passwordVar is the environment variable of a role's password.
func passwordVar(role string) string {
	if role == rolePolicyAdmin {
		return "TOPOSCHED_POLICY_PASSWORD" // its name since the first auth.conf
	}
	return "TOPOSCHED_" + strings.ToUpper(strings.ReplaceAll(role, "-", "_")) + "_PASSWORD"
}

// permsVar is the configuration variable of a role's permissions.
func permsVar(role string) string {
	if role == rolePolicyAdmin {
		return "POLICY_PERMS"
	}
	return strings.ToUpper(strings.ReplaceAll(role, "-", "_")) + "_PERMS"
}
