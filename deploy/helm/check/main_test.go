package main

import (
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

const chartDir = "../toposched"

// rendered renders the chart with the defaults and decodes each object.
func rendered(t *testing.T) ([]any, chartutil.Values) {
	t.Helper()
	out, vals, err := render(chartDir, valueSets["defaults"])
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
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, objs []any)
		want   string // in the error; "" for none
	}{
		{"the chart", func(*testing.T, []any) {}, ""},
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
		}, "--nats-nkey: the agent signs in with its node's seed"},
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, vals := rendered(t)
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
	} {
		vs := valueSet{vals: map[string]any{"nats": map[string]any{"enabled": false}, "auth": tc.auth}}
		if _, err := check(chartDir, vs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("auth %v: error %v, want one with %q", tc.auth, err, tc.want)
		}
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
	for _, svc := range []string{"analysis", "placement", "optimizer", "discovery"} {
		it := vol(t, pod(t, objs, svc), "nkey").Secret.Items
		if len(it) != 1 || it[0].Mode == nil || *it[0].Mode != 0o440 {
			t.Errorf("%s: items %+v, want one of mode 0440", svc, it)
		}
	}
}
