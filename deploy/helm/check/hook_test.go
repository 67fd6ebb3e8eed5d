package main

import (
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// hookRole is the credentials' hook's Role.
func hookRole(t *testing.T, objs []any) *rbacv1.Role { return kubeObj[*rbacv1.Role](t, objs) }

func hookJob(t *testing.T, objs []any) *batchv1.Job { return kubeObj[*batchv1.Job](t, objs) }

// The hook's Role names each tenant's Secret as toposched roles
// kube-secrets names it (the same names its tests expect), with the
// values' Secrets, and the Job passes the tenants as they are.
func TestIssueSecretNames(t *testing.T) {
	objs, _ := renderedWith(t, "secured")
	got := slices.Sorted(slices.Values(hookRole(t, objs).Rules[0].ResourceNames))
	want := []string{
		"site-admin", "site-callout", "site-seeds",
		"site-tenant--52esearch-20-4cab", "site-tenant--e7-a0-94-e7-a9-b6", "site-tenant-ml-2dresearch", "site-tenant-research",
		"toposched-nats-roles",
	}
	if !slices.Equal(got, want) {
		t.Errorf("resourceNames %q\nwant %q", got, want)
	}
	args := hookJob(t, objs).Spec.Template.Spec.Containers[0].Args
	if tenants := flagValues(args, "--tenant"); !slices.Equal(tenants, []string{"research", "Research Lab", "ml-research", "研究"}) {
		t.Errorf("the Job's tenants %q", tenants)
	}
	for _, tenant := range []string{"research", "Research Lab", "ml-research", "研究"} {
		if name := tenantSecretName("site-tenant-", tenant); !slices.Contains(got, name) {
			t.Errorf("tenant %q: %s not in the Role", tenant, name)
		}
	}
}

// Each way the hook could give more than it needs, run too late, outlive
// its run, or leave a pod with a Secret no one writes, is found; the chart
// as rendered passes, and with auth.issue off renders no hook.
func TestCheckIssueFindsWrongRights(t *testing.T) {
	for _, tc := range []struct {
		name   string
		set    string
		change func(t *testing.T, objs []any)
		want   string // in the error; "" for none
	}{
		{"the chart", "defaults", func(*testing.T, []any) {}, ""},
		{"the chart with tenants", "secured", func(*testing.T, []any) {}, ""},
		{"the chart without the hook", "issue-off", func(*testing.T, []any) {}, ""},
		{"list of every Secret", "defaults", func(t *testing.T, objs []any) {
			r := hookRole(t, objs)
			r.Rules[0].Verbs = append(r.Rules[0].Verbs, "list")
		}, "its rules are not get and update"},
		{"get of any Secret", "defaults", func(t *testing.T, objs []any) {
			r := hookRole(t, objs)
			r.Rules[1].Verbs = append(r.Rules[1].Verbs, "get")
		}, "its rules are not get and update"},
		{"a Secret left out of the names", "defaults", func(t *testing.T, objs []any) {
			r := hookRole(t, objs)
			r.Rules[0].ResourceNames = r.Rules[0].ResourceNames[1:]
		}, "its rules are not get and update"},
		{"another Secret named", "defaults", func(t *testing.T, objs []any) {
			r := hookRole(t, objs)
			r.Rules[0].ResourceNames = append(r.Rules[0].ResourceNames, "t-toposched-kube-token")
		}, "its rules are not get and update"},
		{"bound to another ServiceAccount too", "defaults", func(t *testing.T, objs []any) {
			b := kubeObj[*rbacv1.RoleBinding](t, objs)
			b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "t-toposched-kube"})
		}, "gives rights on Secrets to ServiceAccount toposched/t-toposched-kube"},
		{"a ClusterRole on Secrets", "defaults", func(t *testing.T, objs []any) {
			r := kubeObj[*rbacv1.ClusterRole](t, objs)
			r.Rules = append(r.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		}, "a right on Secrets beyond the release's namespace"},
		{"a second Role on Secrets", "defaults", func(t *testing.T, objs []any) {
			r := hookRole(t, objs).DeepCopy()
			r.Name = "t-toposched-more"
			objs[0] = r
		}, "both give rights on Secrets"},
		{"a service runs as the hook", "defaults", func(t *testing.T, objs []any) {
			pod(t, objs, "placement").ServiceAccountName = "t-toposched-issue"
		}, "runs as the credentials' hook's ServiceAccount"},
		{"the Job mounts the issuer's seed", "defaults", func(t *testing.T, objs []any) {
			s := &hookJob(t, objs).Spec.Template.Spec
			s.Volumes = append(s.Volumes, corev1.Volume{Name: "callout", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "toposched-auth-callout"}}})
		}, "mounts the Secrets [toposched-auth-callout]"},
		{"the Job after the pods on upgrade", "defaults", func(t *testing.T, objs []any) {
			hookJob(t, objs).Annotations[hookAnnotation] = "pre-install,post-upgrade"
		}, "not a pre-upgrade hook"},
		{"the rights outlive the hook", "defaults", func(t *testing.T, objs []any) {
			hookRole(t, objs).Annotations[hookDeletePolicy] = "before-hook-creation"
		}, "lacks hook-succeeded"},
		{"the rights after the Job", "defaults", func(t *testing.T, objs []any) {
			kubeObj[*rbacv1.RoleBinding](t, objs).Annotations[hookWeight] = "5"
		}, "want a negative one"},
		{"a pod mounts a Secret the hook does not write", "defaults", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "placement"), "nkey").Secret.SecretName = "handmade"
		}, "mounts the Secret handmade, which the credentials' hook does not write"},
		{"a tenant left out of the Job", "secured", func(t *testing.T, objs []any) {
			c := &hookJob(t, objs).Spec.Template.Spec.Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return a == "--tenant=ml-research" })
		}, "want auth.tenants"},
		{"another namespace", "defaults", func(t *testing.T, objs []any) {
			c := &hookJob(t, objs).Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--namespace=kube-system")
		}, `--namespace "kube-system"`},
		{"a hook with auth.issue off", "issue-off", func(t *testing.T, objs []any) {
			objs[0] = &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "x"}}
		}, "auth.issue off"},
	} {
		objs, vals := renderedWith(t, tc.set)
		tc.change(t, objs)
		err := checkIssue(objs, vals)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one with %q", tc.name, err, tc.want)
		}
	}
}
