package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/toposched/toposched/events"
	"github.com/toposched/toposched/events/natsserver"
	"github.com/toposched/toposched/internal/authcallout"
)

// The keys of the Secrets roles kube-secrets writes that are no seed file
// of a role: the NATS servers' users and the system account's password
// (the Helm chart's NATS pods read both), and a tenant's seed, whose file
// name (tenant-<tenant>.nk, %XX escaped) may hold bytes a Secret's key
// may not.
const (
	rolesConfKey   = "roles.conf"
	sysPasswordKey = "sys-password"
	tenantSeedKey  = "tenant.nk"
)

// Annotations of a tenant's Secret: whose seed it holds, so that an
// administrator who hands it out need not decode its name.
const (
	tenantAnnotation = "toposched.io/tenant"
	roleAnnotation   = "toposched.io/role"
)

// maxSecretTries bounds the re-reads after another writer changed a
// Secret between this run's read and its write: each try that fails so
// found a newer Secret, so only a writer that never stops could exhaust
// them.
const maxSecretTries = 10

// kubeSecrets is what roles kube-secrets writes: the Secrets of the Helm
// chart's identities, in one namespace.
type kubeSecrets struct {
	// Prefix is the subjects' prefix, which the roles' permissions name.
	Prefix string
	// Account is the NATS account of toposched's users in roles.conf.
	Account string
	// ServicesSecret holds a seed per service in Services, <svc>.nk.
	ServicesSecret string
	Services       []string
	// CalloutSecret (empty: no auth callout) holds auth-callout.nk and the
	// issuer's seed; roles.conf then turns the callout on.
	CalloutSecret string
	// AdminSecret holds the administrator's seeds, launcher.nk and
	// policy-admin.nk.
	AdminSecret string
	// RolesSecret holds roles.conf and sys-password, the NATS servers'.
	RolesSecret string
	// Tenants each get a Secret, TenantPrefix and the tenant's name
	// (tenantSecretName), holding its seed as tenant.nk.
	Tenants      []string
	TenantPrefix string
	// Adopt lets a run rewrite a roles.conf it did not write (no
	// managedBy label): an administrator's, whose users this run may not
	// issue, so they would be signed out.
	Adopt bool
}

// managedBy is the label value of the Secrets roles kube-secrets made.
const managedBy = "toposched-roles"

// seedKey is one key of a Secret that holds a seed: a role's user seed,
// or the auth callout's issuer (role "").
type seedKey struct {
	key  string
	role string
}

// file is the key's file in the private directory the seeds are made in:
// the name roles issue gives it.
func (k seedKey) file() string {
	if k.role == "" {
		return authcallout.IssuerFile
	}
	return k.role + natsserver.SeedFileSuffix
}

// seedSecret is a Secret of seeds.
type seedSecret struct {
	name        string
	keys        []seedKey
	annotations map[string]string
}

// secretResult says what a run did to one Secret's keys.
type secretResult struct {
	Name           string
	Kept, Added    []string
	Wrote, Created bool
}

// plan lists the Secrets of seeds, checking every name.
func (k kubeSecrets) plan() ([]seedSecret, error) {
	var out []seedSecret
	var errs []error
	if k.ServicesSecret == "" || len(k.Services) == 0 {
		errs = append(errs, errors.New("--services-secret and --service: the services' seeds are required (the chart's Deployments mount them)"))
	}
	s := seedSecret{name: k.ServicesSecret}
	for _, svc := range k.Services {
		if !slices.Contains(serviceNames, svc) {
			errs = append(errs, fmt.Errorf("--service %q: no such service (%s)", svc, strings.Join(serviceNames, ", ")))
			continue
		}
		if slices.ContainsFunc(s.keys, func(x seedKey) bool { return x.role == svc }) {
			continue
		}
		s.keys = append(s.keys, seedKey{svc + natsserver.SeedFileSuffix, svc})
	}
	out = append(out, s)
	if k.CalloutSecret != "" {
		out = append(out, seedSecret{name: k.CalloutSecret, keys: []seedKey{
			{roleAuthCallout + natsserver.SeedFileSuffix, roleAuthCallout},
			{authcallout.IssuerFile, ""},
		}})
	}
	if k.AdminSecret == "" {
		errs = append(errs, errors.New("--admin-secret: the administrator's seeds (launcher, policy-admin) need a Secret"))
	}
	out = append(out, seedSecret{name: k.AdminSecret, keys: []seedKey{
		{roleLauncher + natsserver.SeedFileSuffix, roleLauncher},
		{rolePolicyAdmin + natsserver.SeedFileSuffix, rolePolicyAdmin},
	}})
	for _, t := range k.Tenants {
		role, err := events.TenantScope(t).Role()
		if err != nil {
			errs = append(errs, fmt.Errorf("--tenant %q: %w", t, err))
			continue
		}
		name := tenantSecretName(k.TenantPrefix, t)
		if slices.ContainsFunc(out, func(x seedSecret) bool { return x.name == name }) {
			continue // a tenant named twice
		}
		out = append(out, seedSecret{name: name, keys: []seedKey{{tenantSeedKey, role}},
			annotations: map[string]string{tenantAnnotation: t, roleAnnotation: role}})
	}
	if k.RolesSecret == "" {
		errs = append(errs, errors.New("--roles-secret: the NATS servers' users need a Secret"))
	}
	seen := map[string]bool{k.RolesSecret: true}
	for _, s := range out {
		for _, msg := range validation.IsDNS1123Subdomain(s.name) {
			errs = append(errs, fmt.Errorf("secret name %q: %s", s.name, msg))
		}
		if seen[s.name] && s.name != "" {
			errs = append(errs, fmt.Errorf("secret name %q: named twice (each Secret is mounted by its own pods alone)", s.name))
		}
		seen[s.name] = true
	}
	for _, msg := range validation.IsDNS1123Subdomain(k.RolesSecret) {
		errs = append(errs, fmt.Errorf("--roles-secret %q: %s", k.RolesSecret, msg))
	}
	return out, errors.Join(errs...)
}

// tenantSecretName is the Secret of a tenant's seed: prefix, then the
// tenant's name with every byte but a lower-case letter or a digit
// written -xx (lower-case hex). Each escape is three bytes long and only
// an escape holds '-', so the name is read back one way only: no two
// tenants share a Secret. The name ends in a letter or digit, as
// Kubernetes requires.
func tenantSecretName(prefix, tenant string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i := 0; i < len(tenant); i++ {
		c := tenant[i]
		if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "-%02x", c)
	}
	return b.String()
}

// run makes every Secret of k exist with a seed for each of its keys:
// seeds already in a Secret are kept byte for byte (services running with
// them stay signed in), missing ones are generated; then it rewrites
// roles.conf for the roles of this run, keeping sys-password once made.
// The seeds are made in a private temporary directory by roles issue's
// code, and the directory is removed before it returns. Another run at
// the same time never makes a second seed for a role: a Secret is created
// only if it does not exist and updated only at the version read, and a
// write refused for either reason is tried again from a new read.
func (k kubeSecrets) run(ctx context.Context, secrets typedcorev1.SecretInterface) ([]secretResult, error) {
	plan, err := k.plan()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "toposched-roles-")
	if err != nil {
		return nil, fmt.Errorf("seeds directory: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }() // seeds: gone whatever else failed
	var out []secretResult
	for _, s := range plan {
		res, err := ensureSeedSecret(ctx, secrets, dir, s)
		if err != nil {
			return out, err
		}
		out = append(out, res)
	}
	conf, err := k.rolesConf(dir)
	if err != nil {
		return out, err
	}
	res, err := ensureRolesSecret(ctx, secrets, k.RolesSecret, conf, k.Adopt)
	if err != nil {
		return out, err
	}
	return append(out, res), nil
}

// rolesConf is roles conf's accounts block for the seeds in dir.
func (k kubeSecrets) rolesConf(dir string) ([]byte, error) {
	r := roles{k.Prefix}
	creds, errs := natsserver.ReadCredentials(dir, r.permissions)
	if len(errs) > 0 {
		return nil, fmt.Errorf("roles.conf: %w", errors.Join(errs...))
	}
	var issuer string
	if k.CalloutSecret != "" {
		var err error
		if issuer, err = authcallout.IssuerPublicKey(filepath.Join(dir, authcallout.IssuerFile)); err != nil {
			return nil, fmt.Errorf("roles.conf: %w", err)
		}
	}
	var buf bytes.Buffer
	w := &confWriter{w: &buf, r: r}
	w.printf("# toposched's NATS users, one per seed of the Secrets toposched roles\n" +
		"# kube-secrets wrote (the Helm chart's hook; do not edit: the next\n" +
		"# helm upgrade writes it again). The system account's password comes\n" +
		"# from the server's environment.\n\n")
	if err := w.nkeys(k.Account, creds, issuer); err != nil {
		return nil, fmt.Errorf("roles.conf: %w", err)
	}
	return buf.Bytes(), nil
}

// ensureSeedSecret makes the Secret s hold a seed for each of its keys,
// keeping those it has, through dir.
func ensureSeedSecret(ctx context.Context, secrets typedcorev1.SecretInterface, dir string, s seedSecret) (secretResult, error) {
	for range maxSecretTries {
		cur, err := secrets.Get(ctx, s.name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cur = nil
		case err != nil:
			return secretResult{}, fmt.Errorf("secret %s: %w", s.name, err)
		}
		res := secretResult{Name: s.name, Created: cur == nil}
		// The keys as the Secret holds them, in place of an earlier try's.
		for _, key := range s.keys {
			file := filepath.Join(dir, key.file())
			if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return res, fmt.Errorf("secret %s: %w", s.name, err)
			}
			if cur == nil {
				continue
			}
			if b, ok := cur.Data[key.key]; ok {
				if err := os.WriteFile(file, b, 0o600); err != nil {
					return res, fmt.Errorf("secret %s: key %s: %w", s.name, key.key, err)
				}
			}
		}
		var roles []natsserver.Role
		issuer := false
		for _, key := range s.keys {
			if key.role == "" {
				issuer = true
				continue
			}
			roles = append(roles, natsserver.Role{Name: key.role})
		}
		var made []string
		if len(roles) > 0 {
			creds, err := natsserver.EnsureCredentials(dir, roles)
			if err != nil {
				return res, fmt.Errorf("secret %s: %w", s.name, err)
			}
			made = creds.Created()
		}
		if issuer {
			_, created, err := authcallout.EnsureIssuer(filepath.Join(dir, authcallout.IssuerFile))
			if err != nil {
				return res, fmt.Errorf("secret %s: %w", s.name, err)
			}
			if created {
				made = append(made, "")
			}
		}
		next := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Labels: map[string]string{
				"app.kubernetes.io/name":       "toposched",
				"app.kubernetes.io/component":  "credentials",
				"app.kubernetes.io/managed-by": managedBy,
			}, Annotations: s.annotations},
			Type: corev1.SecretTypeOpaque,
		}
		if cur != nil {
			next = cur.DeepCopy()
		}
		if next.Data == nil {
			next.Data = map[string][]byte{}
		}
		for _, key := range s.keys {
			if !slices.Contains(made, key.role) {
				res.Kept = append(res.Kept, key.key)
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, key.file()))
			if err != nil {
				return res, fmt.Errorf("secret %s: key %s: %w", s.name, key.key, err)
			}
			next.Data[key.key] = b
			res.Added = append(res.Added, key.key)
		}
		if cur != nil && len(res.Added) == 0 {
			return res, nil
		}
		res.Wrote = true
		if again, err := writeSecret(ctx, secrets, cur, next); !again {
			return res, err
		}
		// Another run wrote it first: its seeds are the ones kept.
	}
	return secretResult{}, fmt.Errorf("secret %s: changed by another writer at each of %d tries", s.name, maxSecretTries)
}

// ensureRolesSecret writes conf into the Secret name's roles.conf, and a
// system account password once: one there is kept. A roles.conf that
// another hand wrote is replaced only with adopt: the users it has that
// this run does not issue (an administrator's launcher, a tenant not in
// the chart's values) would be signed out at the servers' next reload.
func ensureRolesSecret(ctx context.Context, secrets typedcorev1.SecretInterface, name string, conf []byte, adopt bool) (secretResult, error) {
	for range maxSecretTries {
		cur, err := secrets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			cur = nil
		case err != nil:
			return secretResult{}, fmt.Errorf("secret %s: %w", name, err)
		}
		res := secretResult{Name: name, Created: cur == nil}
		next := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				"app.kubernetes.io/name":       "toposched",
				"app.kubernetes.io/component":  "nats-users",
				"app.kubernetes.io/managed-by": managedBy,
			}},
			Type: corev1.SecretTypeOpaque,
		}
		if cur != nil {
			next = cur.DeepCopy()
		}
		if next.Data == nil {
			next.Data = map[string][]byte{}
		}
		if len(next.Data[sysPasswordKey]) == 0 {
			pw := make([]byte, 24)
			if _, err := rand.Read(pw); err != nil {
				return res, fmt.Errorf("secret %s: %s: %w", name, sysPasswordKey, err)
			}
			next.Data[sysPasswordKey] = []byte(hex.EncodeToString(pw))
			res.Added = append(res.Added, sysPasswordKey)
		} else {
			res.Kept = append(res.Kept, sysPasswordKey)
		}
		if bytes.Equal(next.Data[rolesConfKey], conf) {
			res.Kept = append(res.Kept, rolesConfKey)
		} else {
			if old := next.Data[rolesConfKey]; len(old) > 0 && next.Labels["app.kubernetes.io/managed-by"] != managedBy && !adopt {
				return res, fmt.Errorf("secret %s: its %s was not written by roles kube-secrets (no label app.kubernetes.io/managed-by=%s): "+
					"writing it again would sign out every user in it this run does not issue; put those users' seeds in the Secrets this run reads "+
					"and run again with --adopt (the chart: auth.issueJob.adopt), or leave the Secrets to the administrator (auth.issue false)", name, rolesConfKey, managedBy)
			}
			if next.Labels == nil {
				next.Labels = map[string]string{}
			}
			next.Labels["app.kubernetes.io/managed-by"] = managedBy
			next.Data[rolesConfKey] = conf
			res.Added = append(res.Added, rolesConfKey)
		}
		if cur != nil && len(res.Added) == 0 {
			return res, nil
		}
		res.Wrote = true
		if again, err := writeSecret(ctx, secrets, cur, next); !again {
			return res, err
		}
	}
	return secretResult{}, fmt.Errorf("secret %s: changed by another writer at each of %d tries", name, maxSecretTries)
}

// writeSecret creates next where cur is nil, or else updates it at cur's
// version. It asks for another try (again) when another writer came
// first: the Secret existed after all, or changed since it was read.
func writeSecret(ctx context.Context, secrets typedcorev1.SecretInterface, cur, next *corev1.Secret) (again bool, err error) {
	if cur == nil {
		_, err = secrets.Create(ctx, next, metav1.CreateOptions{})
	} else {
		_, err = secrets.Update(ctx, next, metav1.UpdateOptions{})
	}
	switch {
	case err == nil:
		return false, nil
	case apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err):
		return true, nil
	default:
		return false, fmt.Errorf("secret %s: %w", next.Name, err)
	}
}

// writeSecretResults prints a Secret a line: its keys kept and added.
func writeSecretResults(w io.Writer, ns string, results []secretResult) error {
	for _, r := range results {
		what := "unchanged"
		switch {
		case r.Created:
			what = "created"
		case r.Wrote:
			what = "updated"
		}
		line := fmt.Sprintf("secret %s/%s %s", ns, r.Name, what)
		if len(r.Kept) > 0 {
			line += ": kept " + strings.Join(r.Kept, " ")
		}
		if len(r.Added) > 0 {
			sep := ";"
			if len(r.Kept) == 0 {
				sep = ":"
			}
			line += sep + " new " + strings.Join(r.Added, " ")
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

func newRolesKubeSecrets(g *globals) *cobra.Command {
	k := kubeSecrets{
		Account:        "TOPOSCHED",
		ServicesSecret: "toposched-service-nkeys",
		CalloutSecret:  "toposched-auth-callout",
		AdminSecret:    "toposched-admin-nkeys",
		RolesSecret:    "toposched-nats-roles",
		TenantPrefix:   "toposched-tenant-",
	}
	var namespace, kubeconfig string
	var callout bool
	cmd := &cobra.Command{
		Use:   "kube-secrets --namespace NS --service SVC... [--auth-callout] [--tenant TENANT]...",
		Short: "Issue the Helm chart's credentials as Kubernetes Secrets, keeping every seed already there",
		Long: `kube-secrets does what roles issue and roles conf do, into Kubernetes
Secrets of one namespace instead of a directory: the Helm chart's hook runs
it at every helm install and upgrade. It writes

  --services-secret   a seed per --service (<svc>.nk), each Deployment's own
  --auth-callout-secret  with --auth-callout: auth-callout.nk and
                      auth-callout-issuer.seed, the Kubernetes service's alone
  --admin-secret      launcher.nk and policy-admin.nk, the administrator's
  --tenant-secret-prefix + the tenant's name: each --tenant's seed, key
                      tenant.nk (bytes of the name other than a-z and 0-9
                      are -xx: tenant Research is toposched-tenant--52esearch)
  --roles-secret      roles.conf, the NATS servers' users for these seeds
                      (and the auth callout), and sys-password

A seed already in its Secret is kept byte for byte, so that what runs with it
stays signed in; a missing one is added; sys-password is made once; roles.conf
is written again to let in exactly this run's roles. The seeds never touch a
disk but a private temporary directory, removed before the command exits. Two
runs at once make one seed per role: a Secret is created only if none exists
and updated only at the version read, and the loser reads it again. No
operator seed is issued: on Kubernetes each service signs in as itself.`,
		Example: `  toposched roles kube-secrets --kubeconfig in-cluster --namespace toposched \
    --service analysis --service placement --service optimizer --service discovery --service kube \
    --auth-callout --tenant research`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if namespace == "" {
				return errors.New("--namespace: required (the release's namespace, where the chart's pods mount the Secrets)")
			}
			if !callout {
				k.CalloutSecret = ""
			}
			k.Prefix = g.prefix
			if _, err := k.plan(); err != nil {
				return err
			}
			kf := kubeFlags{kubeconfig: kubeconfig, qps: 5, burst: 10}
			cfg, err := kf.restConfig()
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
			}
			results, err := k.run(cmd.Context(), client.CoreV1().Secrets(namespace))
			if werr := writeSecretResults(cmd.OutOrStdout(), namespace, results); werr != nil {
				return errors.Join(err, werr)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&namespace, "namespace", "", "the namespace of the Secrets (required)")
	f.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file, or '"+inCluster+"' for the pod's ServiceAccount (default: in-cluster inside a pod, else $KUBECONFIG or ~/.kube/config)")
	f.StringArrayVar(&k.Services, "service", nil, "a service run on its own that gets a seed (repeatable): "+strings.Join(serviceNames, ", "))
	f.StringVar(&k.ServicesSecret, "services-secret", k.ServicesSecret, "the Secret of the services' seeds")
	f.BoolVar(&callout, "auth-callout", false, "the auth callout's keys, for node agents that sign in with their pod's ServiceAccount token; roles.conf turns the callout on")
	f.StringVar(&k.CalloutSecret, "auth-callout-secret", k.CalloutSecret, "the Secret of the auth callout's keys (with --auth-callout)")
	f.StringVar(&k.AdminSecret, "admin-secret", k.AdminSecret, "the Secret of the administrator's seeds, launcher.nk and policy-admin.nk")
	f.StringVar(&k.RolesSecret, "roles-secret", k.RolesSecret, "the Secret of the NATS servers' roles.conf and sys-password")
	f.StringArrayVar(&k.Tenants, "tenant", nil, "a tenant whose users get a seed, in a Secret of its own (repeatable)")
	f.StringVar(&k.TenantPrefix, "tenant-secret-prefix", k.TenantPrefix, "the start of each tenant's Secret's name")
	f.StringVar(&k.Account, "account", k.Account, "the account of toposched's users in roles.conf")
	f.BoolVar(&k.Adopt, "adopt", false, "rewrite a roles.conf this command did not write (an administrator's): its users this run does not issue are signed out")
	return cmd
}
