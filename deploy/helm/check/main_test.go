package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const chartDir = "../toposched"

// rendered renders the chart with the defaults and decodes each object.
func rendered(t *testing.T) ([]any, chartutil.Values) {
	t.Helper()
	return renderedWith(t, "defaults")
}

// renderedWith renders the chart with a value set and decodes each object.
func renderedWith(t *testing.T, set string) ([]any, chartutil.Values) {
	t.Helper()
	out, vals, err := render(chartDir, valueSets[set])
	if err != nil {
		t.Fatal(err)
	}
	var objs []any
	for f, text := range out {
		if !strings.HasSuffix(f, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(text, "\n---") {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			_, obj, err := validate([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			if obj != nil {
				objs = append(objs, obj)
			}
		}
	}
	return objs, vals
}

// pod is the pod spec of the Deployment or DaemonSet of component.
func pod(t *testing.T, objs []any, component string) *corev1.PodSpec {
	t.Helper()
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			if o.Spec.Template.Labels["app.kubernetes.io/component"] == component {
				return &o.Spec.Template.Spec
			}
		case *appsv1.DaemonSet:
			if o.Spec.Template.Labels["app.kubernetes.io/component"] == component {
				return &o.Spec.Template.Spec
			}
		}
	}
	t.Fatalf("no pod of %s rendered", component)
	return nil
}

func vol(t *testing.T, p *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	if v := volume(p, name); v != nil {
		return v
	}
	t.Fatalf("no volume %s", name)
	return nil
}

func mode(m int32) *int32 { return &m }

// Each way a pod could sign in as someone else, or let another read its
// seed, is found; the chart as rendered passes.
func TestCheckIdentitiesFindsSharedIdentities(t *testing.T) {
	// The cases of the agents' seeds on the nodes (auth.agentIdentity
	// hostPath); the others render the defaults.
	const hostPath = "agent-hostpath"
	onNodes := map[string]bool{
		"the chart, seeds on the nodes": true, "the agent's seed directory read-write": true, "the agent without TOPOSCHED_DATA_DIR": true,
		"the seed directory not required": true, "the agent as root": true, "a token file with seeds on the nodes": true,
	}
	calloutVolume := corev1.Volume{Name: "c", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: "toposched-auth-callout", Items: []corev1.KeyToPath{{Key: "auth-callout-issuer.seed", Path: "i"}}}}}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, objs []any)
		want   string // in the error; "" for none
	}{
		{"the chart", func(*testing.T, []any) {}, ""},
		{"the chart, seeds on the nodes", func(*testing.T, []any) {}, ""},
		{"a password user (the old chart's)", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "agent").Containers[0]
			c.Args = append(c.Args, "--nats-user=agent-$(NODE_NAME)")
			c.Env = append(c.Env, corev1.EnvVar{Name: "TOPOSCHED_NATS_PASSWORD", Value: "shared"})
		}, "a password user"},
		{"the whole Secret of seeds", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "analysis"), "nkey").Secret.Items = nil
		}, "every service's seed"},
		{"another service's seed", func(t *testing.T, objs []any) {
			it := &vol(t, pod(t, objs, "analysis"), "nkey").Secret.Items[0]
			it.Key, it.Path = "placement.nk", "analysis.nk"
		}, "the seed placement.nk of another role"},
		{"a seed in the agent", func(t *testing.T, objs []any) {
			p := pod(t, objs, "agent")
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: "toposched-service-nkeys", Items: []corev1.KeyToPath{{Key: "discovery.nk", Path: "d.nk"}}}}})
		}, "the seed discovery.nk of another role"},
		{"a seed in the environment", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "optimizer").Containers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "SEED", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "toposched-service-nkeys"}, Key: "optimizer.nk"}}})
		}, "holds the seed"},
		{"--nats-nkey names another file", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "placement").Containers[0]
			for i, a := range c.Args {
				if strings.HasPrefix(a, "--nats-nkey=") {
					c.Args[i] = "--nats-nkey=/etc/toposched/nkey/analysis.nk"
				}
			}
		}, "but its seed is mounted at"},
		{"no --nats-nkey", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "discovery").Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--nats-nkey") })
		}, "0 --nats-nkey flags"},
		{"the seed mounted read-write", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "analysis").Containers[0]
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "nkey" {
					c.VolumeMounts[i].ReadOnly = false
				}
			}
		}, "mounted read-write"},
		{"a seed anyone reads", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "analysis"), "nkey").Secret.Items[0].Mode = mode(0o444)
		}, "others may read it"},
		{"a seed its user cannot read", func(t *testing.T, objs []any) {
			pod(t, objs, "analysis").SecurityContext.FSGroup = nil
		}, "user 65532 cannot read it"},
		{"the agent's seed directory read-write", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "agent").Containers[0]
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "credentials" {
					c.VolumeMounts[i].ReadOnly = false
				}
			}
		}, "is mounted read-write"},
		{"the agent given one seed for every node", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "agent").Containers[0]
			c.Args = append(c.Args, "--nats-nkey=/var/lib/toposched/credentials/agent.nk")
		}, "--nats-nkey: the agent signs in as its node alone"},
		{"the agent without TOPOSCHED_DATA_DIR", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "agent").Containers[0]
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "TOPOSCHED_DATA_DIR" })
		}, "no TOPOSCHED_DATA_DIR"},
		{"the seed directory not required", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "agent"), "credentials").HostPath.Type = nil
		}, "want Directory"},
		{"the agent as root", func(t *testing.T, objs []any) {
			pod(t, objs, "agent").SecurityContext = nil
		}, "does not run as agent.runAsUser"},
		{"a service mounts the nodes' seed directory", func(t *testing.T, objs []any) {
			p := pod(t, objs, "placement")
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "h", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/toposched/credentials/"}}})
		}, "the node's agent seed directory"},
		{"the kube service given placement's seed", func(t *testing.T, objs []any) {
			it := &vol(t, pod(t, objs, "kube"), "nkey").Secret.Items[0]
			it.Key = "placement.nk"
		}, "the seed placement.nk of another role"},
		{"the kube service given a second seed", func(t *testing.T, objs []any) {
			v := vol(t, pod(t, objs, "kube"), "nkey")
			v.Secret.Items = append(v.Secret.Items, corev1.KeyToPath{Key: "discovery.nk", Path: "discovery.nk", Mode: mode(0o440)})
		}, "the seed discovery.nk of another role"},
		{"the kube service signs in as the operator", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			for i, a := range c.Args {
				if strings.HasPrefix(a, "--nats-nkey=") {
					c.Args[i] = "--nats-nkey=/etc/toposched/operator.nk"
				}
			}
		}, "but its seed is mounted at"},
		{"the kube service without its Deployment", func(t *testing.T, objs []any) {
			pod(t, objs, "kube")
			for i, o := range objs {
				if d, ok := o.(*appsv1.Deployment); ok && d.Spec.Template.Labels["app.kubernetes.io/component"] == "kube" {
					objs[i] = nil
				}
			}
		}, "no Deployment of the service kube"},
		{"the agent's token besides a seed directory", func(t *testing.T, objs []any) {
			p := pod(t, objs, "agent")
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "credentials", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/toposched/credentials"}}})
		}, "the nodes' seed directory /etc/toposched/credentials, with auth.agentIdentity kubernetes"},
		{"a Secret in the agent besides its token", func(t *testing.T, objs []any) {
			p := pod(t, objs, "agent")
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "site-keys"}}})
		}, "the Secret site-keys: the agent's one credential is its token"},
		{"a second token in the agent", func(t *testing.T, objs []any) {
			p := pod(t, objs, "agent")
			p.Volumes = append(p.Volumes, *vol(t, p, "nats-token"))
			p.Volumes[len(p.Volumes)-1].Name = "api"
		}, "2 projected ServiceAccount tokens"},
		{"the agent's API token", func(t *testing.T, objs []any) {
			pod(t, objs, "agent").AutomountServiceAccountToken = nil
		}, "an API token besides its NATS token"},
		{"the agent's token for the API server", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "agent"), "nats-token").Projected.Sources[0].ServiceAccountToken.Audience = ""
		}, "a token for the API server's audience"},
		{"the agent's token for another audience", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "agent"), "nats-token").Projected.Sources[0].ServiceAccountToken.Audience = "vault"
		}, `a token for audience "vault", not auth.agentToken.audience "toposched-nats"`},
		{"the agent's token for a day", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "agent"), "nats-token").Projected.Sources[0].ServiceAccountToken.ExpirationSeconds = ptr(int64(86400))
		}, "want at most 3600"},
		{"a Secret projected beside the token", func(t *testing.T, objs []any) {
			v := vol(t, pod(t, objs, "agent"), "nats-token")
			v.Projected.Sources = append(v.Projected.Sources, corev1.VolumeProjection{Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "x"}}})
		}, "projects more than the NATS token"},
		{"the agent reads another token file", func(t *testing.T, objs []any) {
			setFlag(t, objs, "agent", "--nats-token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token")
		}, "but its token is mounted at /var/run/secrets/toposched/nats/token"},
		{"the agent without its token file", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "agent").Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--nats-token-file") })
		}, "0 --nats-token-file flags"},
		{"the agent's token read-write", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "agent").Containers[0]
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "nats-token" {
					c.VolumeMounts[i].ReadOnly = false
				}
			}
		}, "the token's volume nats-token is mounted read-write"},
		{"the agent as the default ServiceAccount", func(t *testing.T, objs []any) {
			pod(t, objs, "agent").ServiceAccountName = ""
		}, "runs as the namespace's default ServiceAccount"},
		{"the agent given the issuer seed", func(t *testing.T, objs []any) {
			p := pod(t, objs, "agent")
			p.Volumes = append(p.Volumes, calloutVolume)
		}, "the Secret toposched-auth-callout, the auth callout's keys"},
		{"placement given the issuer seed", func(t *testing.T, objs []any) {
			p := pod(t, objs, "placement")
			p.Volumes = append(p.Volumes, calloutVolume)
		}, "Deployment/t-toposched-placement: volume c: the Secret toposched-auth-callout"},
		{"the issuer seed in an environment", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "analysis").Containers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "ISSUER", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "toposched-auth-callout"}, Key: "auth-callout-issuer.seed"}}})
		}, "env ISSUER: the Secret toposched-auth-callout"},
		{"a token file with seeds on the nodes", func(t *testing.T, objs []any) {
			setFlag(t, objs, "agent", "--nats-token-file", "/t")
		}, `--nats-token-file with auth.agentIdentity "hostPath"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := "defaults"
			if onNodes[tc.name] {
				set = hostPath
			}
			objs, vals := renderedWith(t, set)
			tc.change(t, objs)
			err := checkIdentities(objs, vals)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// The value sets the program renders pass; values of the password users
// that are gone fail the render, saying what replaced them.
func TestValueSets(t *testing.T) {
	for name, vs := range valueSets {
		if _, err := check(chartDir, vs); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, tc := range []struct {
		auth map[string]any
		want string
	}{
		{map[string]any{"existingSecret": "toposched-nats"}, "the password users are gone"},
		{map[string]any{"mode": "password"}, "nkeys only"},
		{map[string]any{"servicesSecret": ""}, "auth.servicesSecret"},
		{map[string]any{"agentIdentity": "secret"}, "kubernetes (the pod's ServiceAccount token, answered by the Kubernetes service) or hostPath"},
		{map[string]any{"authCalloutSecret": ""}, "auth.authCalloutSecret"},
		{map[string]any{"agentToken": map[string]any{"audience": ""}}, "the API server's audience"},
		{map[string]any{"agentIdentity": "hostPath", "agentCredentialsHostPath": "", "issue": false}, "auth.agentCredentialsHostPath"},
		{map[string]any{"agentIdentity": "hostPath"}, "auth.issue with auth.agentIdentity hostPath"},
		{map[string]any{"adminSecret": ""}, "auth.adminSecret, auth.natsRolesSecret and auth.tenantSecretPrefix"},
		{map[string]any{"tenants": []any{""}}, "a tenant is a non-empty name"},
		{map[string]any{"tenants": []any{map[string]any{"name": "x"}}}, "a tenant is a non-empty name"},
	} {
		vs := valueSet{vals: map[string]any{"nats": map[string]any{"enabled": false}, "auth": tc.auth}}
		if _, err := check(chartDir, vs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("auth %v: error %v, want one with %q", tc.auth, err, tc.want)
		}
	}
	// The agents' tokens are answered by the Kubernetes service alone.
	vs := valueSet{vals: map[string]any{"nats": map[string]any{"enabled": false}, "kube": map[string]any{"enabled": false}}}
	if _, err := check(chartDir, vs); err == nil || !strings.Contains(err.Error(), "set auth.agentIdentity hostPath") {
		t.Errorf("kube.enabled false with the agents' tokens: %v", err)
	}
}

// The Kubernetes service answers exactly the agents' tokens: their
// ServiceAccount, their audience, with the callout's keys mounted where
// its flags say and readable by it alone; each way that could differ is
// found; the chart as rendered passes.
func TestCheckAgentIdentity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, objs []any)
		want   string // in the error; "" for none
	}{
		{"the chart", func(*testing.T, []any) {}, ""},
		{"the responder's default audience", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--agent-token-audience") })
		}, ""},
		{"the responder takes another audience", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--agent-token-audience", "nats.example.com")
		}, `a token for audience "toposched-nats", but the auth callout (Deployment/t-toposched-kube) takes "nats.example.com"`},
		{"the agents' token for another audience", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "agent"), "nats-token").Projected.Sources[0].ServiceAccountToken.Audience = "https://kubernetes.default.svc"
		}, "but the auth callout"},
		{"the responder for another ServiceAccount", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--agent-service-account", "toposched/default")
		}, "--agent-service-account toposched/default, but the agents run as toposched/t-toposched-agent"},
		{"the responder for every ServiceAccount's tokens", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--agent-service-account") })
		}, "0 --agent-service-account flags"},
		{"the agents' ServiceAccount not rendered", func(t *testing.T, objs []any) {
			for i, o := range objs {
				if sa, ok := o.(*corev1.ServiceAccount); ok && sa.Name == "t-toposched-agent" {
					objs[i] = nil
				}
			}
		}, "its ServiceAccount t-toposched-agent is not rendered"},
		{"the agents' ServiceAccount given API rights", func(t *testing.T, objs []any) {
			b := kubeObj[*rbacv1.ClusterRoleBinding](t, objs)
			b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: "t-toposched-agent", Namespace: "toposched"})
		}, "gives a role to the agents' ServiceAccount t-toposched-agent"},
		{"the issuer seed read from elsewhere", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--auth-callout-issuer-seed", "/etc/toposched/nkey/issuer.seed")
		}, "but auth-callout-issuer.seed of the Secret toposched-auth-callout is mounted at"},
		{"the issuer seed not mounted", func(t *testing.T, objs []any) {
			v := vol(t, pod(t, objs, "kube"), "auth-callout")
			v.Secret.Items = v.Secret.Items[:1]
		}, "no volume holds auth-callout-issuer.seed"},
		{"the issuer seed anyone reads", func(t *testing.T, objs []any) {
			vol(t, pod(t, objs, "kube"), "auth-callout").Secret.Items[1].Mode = mode(0o444)
		}, "auth-callout-issuer.seed: mode 0444: others may read it"},
		{"the responder's seed read-write", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			for i := range c.VolumeMounts {
				if c.VolumeMounts[i].Name == "auth-callout" {
					c.VolumeMounts[i].ReadOnly = false
				}
			}
		}, "is mounted read-write"},
		{"no responder's seed", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--auth-callout-nkey") })
		}, "0 --auth-callout-nkey flags"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, vals := rendered(t)
			tc.change(t, objs)
			err := checkAgentIdentity(objs, vals)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
	// With the seeds on the nodes, the Kubernetes service answers no one.
	objs, vals := renderedWith(t, "agent-hostpath")
	setFlag(t, objs, "kube", "--auth-callout-issuer-seed", "/etc/toposched/auth-callout/auth-callout-issuer.seed")
	if err := checkAgentIdentity(objs, vals); err == nil || !strings.Contains(err.Error(), "answers the auth callout, yet") {
		t.Errorf("a callout with the seeds on the nodes: %v", err)
	}
}

// natsPod is a NATS server pod as the official chart renders it with the
// chart's auth values: nats.conf from a ConfigMap including roles.conf
// from a Secret, which the reloader watches too.
func natsPod() (*corev1.PodSpec, []any) {
	roles := corev1.VolumeMount{Name: "toposched-roles", MountPath: "/etc/toposched-roles", ReadOnly: true}
	config := corev1.VolumeMount{Name: "config", MountPath: "/etc/nats-config"}
	spec := &corev1.PodSpec{
		Containers: []corev1.Container{
			{Name: "nats", Args: []string{"--config", "/etc/nats-config/nats.conf"},
				Env: []corev1.EnvVar{{Name: "NATS_SYS_PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "toposched-nats-roles"}, Key: "sys-password"}}}},
				VolumeMounts: []corev1.VolumeMount{config, roles}},
			{Name: "reloader", Args: []string{"-pid", "/var/run/nats/nats.pid", "-config", "/etc/nats-config/nats.conf", "-config", "/etc/toposched-roles/roles.conf"},
				VolumeMounts: []corev1.VolumeMount{config, roles}},
		},
		Volumes: []corev1.Volume{
			{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "t-nats-config"}}}},
			{Name: "toposched-roles", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "toposched-nats-roles"}}},
		},
	}
	cm := &corev1.ConfigMap{Data: map[string]string{"nats.conf": "{\n  include ../toposched-roles/roles.conf;\n  \"port\": 4222\n}\n"}}
	cm.Name = "t-nats-config"
	return spec, []any{cm}
}

func TestCheckNATSServers(t *testing.T) {
	on, off := authValues{enabled: true}, authValues{}
	for _, tc := range []struct {
		name   string
		auth   authValues
		change func(spec *corev1.PodSpec, cm *corev1.ConfigMap)
		want   string
	}{
		{"the chart's", on, func(*corev1.PodSpec, *corev1.ConfigMap) {}, ""},
		{"no include", on, func(_ *corev1.PodSpec, cm *corev1.ConfigMap) { cm.Data["nats.conf"] = "{port: 4222}\n" }, "includes no file of a mounted Secret"},
		{"include of a file not mounted", on, func(_ *corev1.PodSpec, cm *corev1.ConfigMap) {
			cm.Data["nats.conf"] = "include ../elsewhere/roles.conf;\n"
		}, "includes no file of a mounted Secret"},
		{"no system password", on, func(spec *corev1.PodSpec, _ *corev1.ConfigMap) { spec.Containers[0].Env = nil }, "NATS_SYS_PASSWORD"},
		{"the reloader blind to roles.conf", on, func(spec *corev1.PodSpec, _ *corev1.ConfigMap) {
			spec.Containers[1].VolumeMounts = spec.Containers[1].VolumeMounts[:1]
			spec.Containers[1].Args = spec.Containers[1].Args[:4]
		}, "reloader container"},
		{"roles.conf mounted read-write", on, func(spec *corev1.PodSpec, _ *corev1.ConfigMap) { spec.Containers[0].VolumeMounts[1].ReadOnly = false }, "read-write"},
		{"auth off, users included", off, func(*corev1.PodSpec, *corev1.ConfigMap) {}, "auth off"},
		{"auth off", off, func(spec *corev1.PodSpec, cm *corev1.ConfigMap) {
			cm.Data["nats.conf"] = "{port: 4222}\n"
			spec.Containers[0].Env = nil
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, objs := natsPod()
			tc.change(spec, objs[0].(*corev1.ConfigMap))
			err := checkNATSServers(spec, objs, tc.auth)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// The chart's mode 0440 is YAML's octal, as the API server gets it
// (read as decimal 440 it would be 0670: group-writable).
func TestSeedModeIsOctal(t *testing.T) {
	objs, _ := rendered(t)
	for _, svc := range []string{"analysis", "placement", "optimizer", "discovery", "kube"} {
		it := vol(t, pod(t, objs, svc), "nkey").Secret.Items
		if len(it) != 1 || it[0].Mode == nil || *it[0].Mode != 0o440 {
			t.Errorf("%s: items %+v, want one of mode 0440", svc, it)
		}
	}
	for _, it := range vol(t, pod(t, objs, "kube"), "auth-callout").Secret.Items {
		if it.Mode == nil || *it.Mode != 0o440 {
			t.Errorf("the auth callout's %s: mode %v, want 0440", it.Key, it.Mode)
		}
	}
}

// kubeObj is the one rendered object of type T (the Kubernetes service's
// ClusterRole, ClusterRoleBinding).
func kubeObj[T any](t *testing.T, objs []any) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d objects of type %T rendered, want 1", len(found), found)
	}
	return found[0]
}

// setFlag sets a flag of the container running svc, adding it if absent.
func setFlag(t *testing.T, objs []any, svc, flag, value string) {
	t.Helper()
	c := &pod(t, objs, svc).Containers[0]
	for i, a := range c.Args {
		if strings.HasPrefix(a, flag+"=") {
			c.Args[i] = flag + "=" + value
			return
		}
	}
	c.Args = append(c.Args, flag+"="+value)
}

// Each way the Kubernetes service could get rights other than
// files/kube-rules.yaml's, or they could reach another pod, or its
// replicas and the agents could go wrong, is found; the chart as
// rendered passes.
func TestCheckKubeFindsWrongRights(t *testing.T) {
	tokenVolume := corev1.Volume{Name: "token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "t-toposched-placement-token"}}}
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, objs []any)
		want   string // in the error; "" for none
	}{
		{"the chart", func(*testing.T, []any) {}, ""},
		{"a rule the file has not", func(t *testing.T, objs []any) {
			r := kubeObj[*rbacv1.ClusterRole](t, objs)
			r.Rules = append(r.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
		}, `extra: groups [""] resources ["secrets"] verbs ["get"]`},
		{"a rule of the file left out", func(t *testing.T, objs []any) {
			r := kubeObj[*rbacv1.ClusterRole](t, objs)
			r.Rules = r.Rules[1:]
		}, `missing: groups [""] resources ["pods"]`},
		{"a verb more on a rule", func(t *testing.T, objs []any) {
			r := kubeObj[*rbacv1.ClusterRole](t, objs)
			r.Rules[2].Verbs = append(r.Rules[2].Verbs, "patch")
		}, "its rules are not files/kube-rules.yaml's"},
		{"an aggregated ClusterRole", func(t *testing.T, objs []any) {
			kubeObj[*rbacv1.ClusterRole](t, objs).AggregationRule = &rbacv1.AggregationRule{}
		}, "aggregationRule"},
		{"bound to the default ServiceAccount", func(t *testing.T, objs []any) {
			kubeObj[*rbacv1.ClusterRoleBinding](t, objs).Subjects[0].Name = "default"
		}, "gives the ClusterRole to ServiceAccount toposched/default"},
		{"bound to a ServiceAccount of another namespace", func(t *testing.T, objs []any) {
			kubeObj[*rbacv1.ClusterRoleBinding](t, objs).Subjects[0].Namespace = "kube-system"
		}, "gives the ClusterRole to ServiceAccount kube-system/t-toposched-kube"},
		{"bound to every ServiceAccount too", func(t *testing.T, objs []any) {
			b := kubeObj[*rbacv1.ClusterRoleBinding](t, objs)
			b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts"})
		}, "gives the ClusterRole to Group /system:serviceaccounts"},
		{"binding cluster-admin", func(t *testing.T, objs []any) {
			kubeObj[*rbacv1.ClusterRoleBinding](t, objs).RoleRef.Name = "cluster-admin"
		}, "binds ClusterRole cluster-admin"},
		{"the kube pod as the default ServiceAccount", func(t *testing.T, objs []any) {
			pod(t, objs, "kube").ServiceAccountName = ""
		}, "runs as the namespace's default ServiceAccount"},
		{"the kube pod as a ServiceAccount not rendered", func(t *testing.T, objs []any) {
			pod(t, objs, "kube").ServiceAccountName = "t-toposched-scheduler"
		}, "its ServiceAccount t-toposched-scheduler is not rendered"},
		{"the kube pod without its token", func(t *testing.T, objs []any) {
			pod(t, objs, "kube").AutomountServiceAccountToken = ptr(false)
		}, "no token for --kubeconfig=in-cluster"},
		{"placement runs as the kube ServiceAccount", func(t *testing.T, objs []any) {
			pod(t, objs, "placement").ServiceAccountName = "t-toposched-kube"
		}, "Deployment/t-toposched-placement: runs as the Kubernetes service's ServiceAccount"},
		{"analysis mounts a token", func(t *testing.T, objs []any) {
			pod(t, objs, "analysis").AutomountServiceAccountToken = nil
		}, "Deployment/t-toposched-analysis: mounts a ServiceAccount token"},
		{"the agent mounts a token", func(t *testing.T, objs []any) {
			pod(t, objs, "agent").AutomountServiceAccountToken = ptr(true)
		}, "DaemonSet/t-toposched-agent: mounts a ServiceAccount token"},
		{"another ServiceAccount's token Secret in the kube pod", func(t *testing.T, objs []any) {
			p := pod(t, objs, "kube")
			p.Volumes = append(p.Volumes, tokenVolume)
		}, "volume token: the Secret t-toposched-placement-token"},
		{"a token Secret in the kube pod's environment", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			c.Env = append(c.Env, corev1.EnvVar{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "t-toposched-placement-token"}, Key: "token"}}})
		}, "env TOKEN: the Secret t-toposched-placement-token"},
		{"a token for another audience", func(t *testing.T, objs []any) {
			p := pod(t, objs, "kube")
			p.Volumes = append(p.Volumes, corev1.Volume{Name: "vault", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Audience: "vault", Path: "t"}}}}}})
		}, "a token for audience vault"},
		{"every kube replica of one name", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--replica", "kube")
		}, "--replica kube: not $(VAR)"},
		{"the kube replica named by its node", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			c.Env[0].ValueFrom.FieldRef.FieldPath = "spec.nodeName"
		}, "--replica $(POD_NAME): not $(VAR)"},
		{"placement replicas without their pod's name", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "placement").Containers[0]
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "TOPOSCHED_REPLICA" })
		}, "no --replica and no TOPOSCHED_REPLICA"},
		{"a lease TTL not placement's", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--lease-ttl", "30s")
		}, "--lease-ttl: kube 30s, placement 10s"},
		{"the same lease TTL spelt otherwise", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--lease-ttl", "10000ms")
		}, ""},
		{"the agent kept off the dedicated nodes", func(t *testing.T, objs []any) {
			p := pod(t, objs, "agent")
			p.Tolerations = slices.DeleteFunc(p.Tolerations, func(x corev1.Toleration) bool { return x.Key == "toposched.io/dedicated" })
		}, "does not tolerate toposched.io/dedicated=true:NoSchedule"},
		{"another dedicated taint than the agent's", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--dedicated-taint", "example.com/gpu-pool")
		}, "does not tolerate example.com/gpu-pool=true:NoSchedule"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, vals := rendered(t)
			tc.change(t, objs)
			err := checkKube(objs, vals, chartDir)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// Every service, the Kubernetes service too, is scraped and probed where
// it serves; each way one could drop out of the ServiceMonitor is found.
func TestCheckMetricsFindsUnscrapedServices(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, objs []any)
		want   string
	}{
		{"the chart", func(*testing.T, []any) {}, ""},
		{"kube without its metrics port", func(t *testing.T, objs []any) {
			pod(t, objs, "kube").Containers[0].Ports = nil
		}, `Deployment/t-toposched-kube: container kube: no port "metrics" 9090`},
		{"kube serving metrics on another port", func(t *testing.T, objs []any) {
			setFlag(t, objs, "kube", "--metrics-listen", "0.0.0.0:9091")
		}, `no port "metrics" 9091`},
		{"kube without --metrics-listen", func(t *testing.T, objs []any) {
			c := &pod(t, objs, "kube").Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--metrics-listen") })
		}, "0 --metrics-listen flags"},
		{"kube's liveness on another path", func(t *testing.T, objs []any) {
			pod(t, objs, "kube").Containers[0].LivenessProbe.HTTPGet.Path = "/metrics"
		}, "liveness probe is not GET /healthz"},
		{"kube without readiness", func(t *testing.T, objs []any) {
			pod(t, objs, "kube").Containers[0].ReadinessProbe = nil
		}, "readiness probe is not GET /readyz"},
		{"the metrics Service selects placement only", func(t *testing.T, objs []any) {
			s := kubeObj[*corev1.Service](t, objs)
			s.Spec.Selector["app.kubernetes.io/component"] = "placement"
		}, "Deployment/t-toposched-kube: no Service selects the pod"},
		{"the metrics Service on another port", func(t *testing.T, objs []any) {
			kubeObj[*corev1.Service](t, objs).Spec.Ports[0].TargetPort = intstr.FromString("http")
		}, "no Service selects the pod on its metrics port"},
		{"the ServiceMonitor on another Service", func(t *testing.T, objs []any) {
			kubeObj[*serviceMonitor](t, objs).Spec.Selector.MatchLabels["app.kubernetes.io/component"] = "api"
		}, "ServiceMonitor/t-toposched does not scrape it"},
		{"the ServiceMonitor on another port", func(t *testing.T, objs []any) {
			kubeObj[*serviceMonitor](t, objs).Spec.Endpoints[0].Port = "http"
		}, "ServiceMonitor/t-toposched does not scrape it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := rendered(t)
			tc.change(t, objs)
			err := checkMetrics(objs)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// brokenChart is a copy of the chart with old replaced by new in file.
func brokenChart(t *testing.T, file, old, new string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, file)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), old) {
		t.Fatalf("%s has no %q", file, old)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The whole check (render, decode, every check) fails on a chart whose
// templates give the Kubernetes service what is not its own.
func TestCheckFindsBrokenKubeTemplates(t *testing.T) {
	for _, tc := range []struct {
		name, file, old, new string
		want                 string
	}{
		{"another service's seed", "templates/kube.yaml",
			"{key: kube.nk, path: kube.nk", "{key: placement.nk, path: kube.nk",
			"the seed placement.nk of another role"},
		{"the whole Secret of seeds", "templates/kube.yaml",
			"            items:\n              - {key: kube.nk, path: kube.nk, mode: 0440}\n", "",
			"every service's seed"},
		{"a rule written in the template", "templates/kube.yaml",
			`{{ .Files.Get "files/kube-rules.yaml" }}`,
			"{{ .Files.Get \"files/kube-rules.yaml\" }}\n- {apiGroups: [\"\"], resources: [secrets], verbs: [get, list]}",
			`extra: groups [""] resources ["secrets"] verbs ["get" "list"]`},
		{"no ServiceAccount of its own", "templates/kube.yaml",
			"      serviceAccountName: {{ $name }}\n", "",
			"runs as the namespace's default ServiceAccount"},
		{"the binding in the default namespace", "templates/kube.yaml",
			"namespace: {{ .Release.Namespace }}", "namespace: default",
			"ServiceAccount default/t-toposched-kube"},
		{"the services given tokens", "templates/deployments.yaml",
			"automountServiceAccountToken: false", "automountServiceAccountToken: true",
			"mounts a ServiceAccount token"},
		{"one replica name for both", "templates/kube.yaml",
			"--replica=$(POD_NAME)", "--replica=kube",
			"--replica kube"},
		{"the lease TTL of its own", "templates/kube.yaml",
			"--lease-ttl={{ .Values.services.placement.leaseTTL }}", "--lease-ttl=15s",
			"--lease-ttl: kube 15s, placement 10s"},
		{"no metrics port", "templates/kube.yaml",
			"            - {name: metrics, containerPort: {{ .Values.metrics.port }}}\n", "",
			`no port "metrics"`},
		{"the agents' token for the API server", "templates/agent-daemonset.yaml",
			"audience: {{ .Values.auth.agentToken.audience | quote }}", `audience: ""`,
			"a token for the API server's audience"},
		{"the agents with their API token", "templates/agent-daemonset.yaml",
			"      automountServiceAccountToken: false\n      securityContext:", "      securityContext:",
			"an API token besides its NATS token"},
		{"the responder for the kube ServiceAccount's tokens", "templates/kube.yaml",
			`--agent-service-account={{ .Release.Namespace }}/{{ include "toposched.agentServiceAccount" . }}`, "--agent-service-account={{ .Release.Namespace }}/{{ $name }}",
			"but the agents run as toposched/t-toposched-agent"},
		{"the issuer seed in every service", "templates/deployments.yaml",
			"        {{- if .Values.tls.enabled }}\n        - name: tls",
			"        - name: issuer\n          secret: {secretName: {{ .Values.auth.authCalloutSecret }}}\n        {{- if .Values.tls.enabled }}\n        - name: tls",
			"volume issuer: the Secret toposched-auth-callout, the auth callout's keys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := brokenChart(t, tc.file, tc.old, tc.new)
			_, err := check(dir, valueSets["defaults"])
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

// With kube.enabled off nothing of the Kubernetes service is rendered, and
// the check asks for none of it; with it on, a ClusterRole left behind by
// a values override is found.
func TestKubeDisabled(t *testing.T) {
	out, vals, err := render(chartDir, valueSets["kube-off"])
	if err != nil {
		t.Fatal(err)
	}
	if text := out["toposched/templates/kube.yaml"]; strings.TrimSpace(text) != "" {
		t.Fatalf("kube.enabled false renders kube.yaml:\n%s", text)
	}
	if _, err := check(chartDir, valueSets["kube-off"]); err != nil {
		t.Fatal(err)
	}
	objs, _ := rendered(t)
	err = checkKube(objs, vals, chartDir)
	if err == nil || !strings.Contains(err.Error(), "kube.enabled is false, yet") {
		t.Fatalf("error %v, want one with %q", err, "kube.enabled is false, yet")
	}
}

// services.placement.computeReference reaches placement and the optimizer,
// which learns the models' speeds and plans moves with it, and no other
// service; unset (the defaults), no service gets the flag.
func TestComputeReferenceArgs(t *testing.T) {
	for set, want := range map[string]map[string]bool{
		"secured":  {"placement": true, "optimizer": true},
		"defaults": {},
	} {
		out, _, err := render(chartDir, valueSets[set])
		if err != nil {
			t.Fatal(err)
		}
		text := out["toposched/templates/deployments.yaml"]
		seen := 0
		for _, doc := range strings.Split(text, "\n---") {
			for _, svc := range []string{"discovery", "analysis", "placement", "optimizer"} {
				if !strings.Contains(doc, "app.kubernetes.io/component: "+svc) {
					continue
				}
				seen++
				if got := strings.Contains(doc, "--compute-reference=a100"); got != want[svc] {
					t.Errorf("%s: %s has --compute-reference=a100: %v, want %v", set, svc, got, want[svc])
				}
			}
		}
		if seen != 4 {
			t.Errorf("%s: %d of the four services' Deployments rendered", set, seen)
		}
	}
}
