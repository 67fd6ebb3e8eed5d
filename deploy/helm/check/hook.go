package main

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// Helm's hook annotations.
const (
	hookAnnotation   = "helm.sh/hook"
	hookWeight       = "helm.sh/hook-weight"
	hookDeletePolicy = "helm.sh/hook-delete-policy"
)

// issueValues are the values of the credentials' hook (auth.issue).
type issueValues struct {
	on                       bool
	tenants                  []string
	adminSecret, rolesSecret string
	tenantPrefix, tlsSecret  string
	calloutSecret, svcSecret string
	agentTokens, tlsEnabled  bool
}

func readIssue(vals chartutil.Values) issueValues {
	a := readAuth(vals)
	get := func(key string) string {
		v, _ := vals.PathValue(key)
		s, _ := v.(string)
		return s
	}
	on, _ := vals.PathValue("auth.issue")
	tls, _ := vals.PathValue("tls.enabled")
	iv := issueValues{
		adminSecret:   get("auth.adminSecret"),
		rolesSecret:   get("auth.natsRolesSecret"),
		tenantPrefix:  get("auth.tenantSecretPrefix"),
		tlsSecret:     get("tls.secretName"),
		calloutSecret: a.calloutSecret,
		svcSecret:     a.servicesSecret,
		agentTokens:   a.agentTokens(),
	}
	iv.tlsEnabled, _ = tls.(bool)
	b, _ := on.(bool)
	iv.on = a.enabled && b
	ts, _ := vals.PathValue("auth.tenants")
	if ts, ok := ts.([]any); ok {
		for _, t := range ts {
			if s, ok := t.(string); ok {
				iv.tenants = append(iv.tenants, s)
			}
		}
	}
	return iv
}

// tenantSecretName is toposched roles kube-secrets' name of a tenant's
// Secret (cmd/toposched/roles_kube.go): prefix, then each byte of the
// name but a-z and 0-9 as -xx. Written again here, in the check's own
// module, so that the chart's template is checked against the command's
// rule and not against itself.
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

// podSecrets are the Secrets a pod spec refers to: volumes, projections
// and environment.
func podSecrets(spec *corev1.PodSpec) []string {
	var out []string
	for _, v := range spec.Volumes {
		if s := v.Secret; s != nil {
			out = append(out, s.SecretName)
		}
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if s := src.Secret; s != nil {
					out = append(out, s.Name)
				}
			}
		}
	}
	for _, c := range containers(spec) {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
				out = append(out, r.SecretKeyRef.Name)
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				out = append(out, e.SecretRef.Name)
			}
		}
	}
	return out
}

// grantsSecrets reports whether a rule gives any right on Secrets.
func grantsSecrets(r rbacv1.PolicyRule) bool {
	core := slices.Contains(r.APIGroups, "") || slices.Contains(r.APIGroups, "*")
	return core && (slices.Contains(r.Resources, "secrets") || slices.Contains(r.Resources, "*"))
}

// checkIssue checks the credentials' hook (auth.issue): a Job, its
// ServiceAccount, Role and RoleBinding, all pre-install and pre-upgrade
// hooks, the rights made before the Job and deleted once it succeeds; the
// Role's get and update name exactly the Secrets the Job writes (what the
// pods mount, the administrator's, the tenants' and the NATS servers'),
// and its create, which RBAC cannot limit by name, is all else it may
// do; its ServiceAccount is the only one with any right on Secrets, bound
// to it alone and run by the Job alone, and the Job mounts no Secret
// (the issuer's seed is in the kube pods alone). Every Secret a pod of
// the chart mounts but TLS's is one the Job writes. With auth.issue off,
// none of it is rendered and nothing has a right on Secrets.
func checkIssue(objs []any, vals chartutil.Values) error {
	iv := readIssue(vals)
	var jobs []*batchv1.Job
	var errs []error
	secretRoles := map[string]bool{} // "Role/x", "ClusterRole/x"
	for _, o := range objs {
		switch o := o.(type) {
		case *batchv1.Job:
			jobs = append(jobs, o)
		case *rbacv1.Role:
			for _, r := range o.Rules {
				if grantsSecrets(r) {
					secretRoles["Role/"+o.Name] = true
				}
			}
		case *rbacv1.ClusterRole:
			for _, r := range o.Rules {
				if grantsSecrets(r) {
					errs = append(errs, fmt.Errorf("ClusterRole/%s: %s: a right on Secrets beyond the release's namespace", o.Name, ruleString(r)))
				}
			}
		}
	}
	if !iv.on {
		if len(jobs) > 0 || len(secretRoles) > 0 {
			errs = append(errs, fmt.Errorf("auth.issue off, yet %d Jobs and %d Roles with rights on Secrets are rendered", len(jobs), len(secretRoles)))
		}
		return errors.Join(errs...)
	}
	if len(jobs) != 1 {
		return errors.Join(append(errs, fmt.Errorf("auth.issue: %d Jobs rendered, want the credentials' hook", len(jobs)))...)
	}
	job := jobs[0]
	spec := &job.Spec.Template.Spec
	where := "Job/" + job.Name
	sa := spec.ServiceAccountName
	if sa == "" || sa == "default" {
		errs = append(errs, fmt.Errorf("%s: runs as the namespace's default ServiceAccount, not its own", where))
	}
	if a := spec.AutomountServiceAccountToken; a != nil && !*a {
		errs = append(errs, fmt.Errorf("%s: no ServiceAccount token, and it writes Secrets through the API", where))
	}
	if s := podSecrets(spec); len(s) > 0 {
		errs = append(errs, fmt.Errorf("%s: mounts the Secrets %v: it needs none (it writes them through the API)", where, s))
	}
	errs = append(errs, checkHookAnnotations(where, job.Annotations, true))

	// What the Job writes, from its args.
	var c *corev1.Container
	for _, x := range containers(spec) {
		if args := append(slices.Clone(x.Command), x.Args...); slices.Contains(args, "kube-secrets") {
			c = x
		}
	}
	if c == nil {
		return errors.Join(append(errs, fmt.Errorf("%s: no container runs toposched roles kube-secrets", where))...)
	}
	args := append(slices.Clone(c.Command), c.Args...)
	last := func(flag string) string {
		v := flagValues(args, flag)
		if len(v) == 0 {
			return ""
		}
		return v[len(v)-1]
	}
	if ns := last("--namespace"); ns != releaseNamespace {
		errs = append(errs, fmt.Errorf("%s: --namespace %q, not the release's %s", where, ns, releaseNamespace))
	}
	written := []string{last("--services-secret"), last("--admin-secret"), last("--roles-secret")}
	if slices.Contains(args, "--auth-callout") {
		written = append(written, last("--auth-callout-secret"))
	} else if iv.agentTokens {
		errs = append(errs, fmt.Errorf("%s: no --auth-callout, yet the agents sign in through it", where))
	}
	tenants := flagValues(args, "--tenant")
	if !slices.Equal(tenants, iv.tenants) {
		errs = append(errs, fmt.Errorf("%s: tenants %q, want auth.tenants %q", where, tenants, iv.tenants))
	}
	for _, t := range tenants {
		written = append(written, tenantSecretName(last("--tenant-secret-prefix"), t))
	}
	for i, w := range []string{iv.svcSecret, iv.adminSecret, iv.rolesSecret} {
		if written[i] != w {
			errs = append(errs, fmt.Errorf("%s: writes the Secret %q where the values name %q", where, written[i], w))
		}
	}

	// Every Secret the pods mount, but TLS's, is one the Job writes.
	for _, w := range workloads(objs) {
		for _, s := range podSecrets(w.spec) {
			if iv.tlsEnabled && s == iv.tlsSecret {
				continue
			}
			if !slices.Contains(written, s) {
				errs = append(errs, fmt.Errorf("%v: mounts the Secret %s, which the credentials' hook does not write", w, s))
			}
		}
	}

	// Who may touch Secrets: the hook's Role alone, to its ServiceAccount
	// alone.
	role := ""
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			if o.Name == sa {
				errs = append(errs, checkHookAnnotations("ServiceAccount/"+o.Name, o.Annotations, false))
			}
		case *rbacv1.Role:
			if !secretRoles["Role/"+o.Name] {
				continue
			}
			if role != "" {
				errs = append(errs, fmt.Errorf("Role/%s and Role/%s: both give rights on Secrets", role, o.Name))
			}
			role = o.Name
			errs = append(errs, checkHookAnnotations("Role/"+o.Name, o.Annotations, false), checkIssueRules(o, written))
		case *rbacv1.RoleBinding:
			bwhere := "RoleBinding/" + o.Name
			if !secretRoles[o.RoleRef.Kind+"/"+o.RoleRef.Name] {
				continue
			}
			errs = append(errs, checkHookAnnotations(bwhere, o.Annotations, false))
			for _, s := range o.Subjects {
				if s.Namespace == "" {
					s.Namespace = releaseNamespace
				}
				if s != (rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: releaseNamespace}) {
					errs = append(errs, fmt.Errorf("%s: gives rights on Secrets to %s %s/%s, not the hook's ServiceAccount %s", bwhere, s.Kind, s.Namespace, s.Name, sa))
				}
			}
		case *rbacv1.ClusterRoleBinding:
			if o.RoleRef.Kind == "Role" || secretRoles[o.RoleRef.Kind+"/"+o.RoleRef.Name] {
				errs = append(errs, fmt.Errorf("ClusterRoleBinding/%s: binds %s %s", o.Name, o.RoleRef.Kind, o.RoleRef.Name))
			}
		}
	}
	if role == "" {
		errs = append(errs, fmt.Errorf("%s: no Role gives it rights on the Secrets it writes", where))
	}
	for _, o := range objs {
		var ws string
		var spec *corev1.PodSpec
		switch o := o.(type) {
		case *appsv1.Deployment:
			ws, spec = "Deployment/"+o.Name, &o.Spec.Template.Spec
		case *appsv1.DaemonSet:
			ws, spec = "DaemonSet/"+o.Name, &o.Spec.Template.Spec
		case *appsv1.StatefulSet:
			ws, spec = "StatefulSet/"+o.Name, &o.Spec.Template.Spec
		default:
			continue
		}
		if spec.ServiceAccountName == sa {
			errs = append(errs, fmt.Errorf("%s: runs as the credentials' hook's ServiceAccount %s, with its rights on Secrets", ws, sa))
		}
	}
	return errors.Join(errs...)
}

// checkIssueRules: the hook's Role gets and updates the Secrets it writes
// by name, creates Secrets (RBAC cannot name what is created), and
// nothing else.
func checkIssueRules(role *rbacv1.Role, written []string) error {
	names := slices.Clone(written)
	slices.Sort(names)
	names = slices.Compact(names)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: names, Verbs: []string{"get", "update"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
	}
	got := make([]rbacv1.PolicyRule, len(role.Rules))
	for i, r := range role.Rules {
		r.ResourceNames = slices.Sorted(slices.Values(r.ResourceNames))
		got[i] = r
	}
	if !reflect.DeepEqual(got, want) {
		return fmt.Errorf("Role/%s: its rules are not get and update of the Secrets the hook writes and create (%s)", role.Name, rulesDiff(got, want))
	}
	return nil
}

// checkHookAnnotations: a pre-install and pre-upgrade hook, replaced at
// each run; the Job after its rights (weight 0 above theirs), and the
// rights deleted once it succeeded.
func checkHookAnnotations(where string, ann map[string]string, job bool) error {
	var errs []error
	hooks := strings.Split(ann[hookAnnotation], ",")
	for _, h := range []string{"pre-install", "pre-upgrade"} {
		if !slices.Contains(hooks, h) {
			errs = append(errs, fmt.Errorf("%s: not a %s hook (%s: %q): the pods would start before their Secrets exist", where, h, hookAnnotation, ann[hookAnnotation]))
		}
	}
	policy := strings.Split(ann[hookDeletePolicy], ",")
	if !slices.Contains(policy, "before-hook-creation") {
		errs = append(errs, fmt.Errorf("%s: %s %q lacks before-hook-creation: the next upgrade would fail on it", where, hookDeletePolicy, ann[hookDeletePolicy]))
	}
	weight := ann[hookWeight]
	switch {
	case job && weight != "0" && weight != "":
		errs = append(errs, fmt.Errorf("%s: %s %q, want 0, after its rights", where, hookWeight, weight))
	case !job:
		if !strings.HasPrefix(weight, "-") {
			errs = append(errs, fmt.Errorf("%s: %s %q, want a negative one: made before the Job", where, hookWeight, weight))
		}
		if !slices.Contains(policy, "hook-succeeded") {
			errs = append(errs, fmt.Errorf("%s: %s %q lacks hook-succeeded: the right on Secrets would outlive the hook", where, hookDeletePolicy, ann[hookDeletePolicy]))
		}
	}
	return errors.Join(errs...)
}
