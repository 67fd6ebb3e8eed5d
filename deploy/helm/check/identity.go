package main

import (
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// authValues are the chart's values that say who signs in as what.
type authValues struct {
	enabled        bool
	servicesSecret string // the Secret of the services' seeds
	agentHostPath  string // each node's directory of its agent's seed
	agentUser      int64  // the agent's user: the seed file's owner
	// agentIdentity is how the agents sign in: "kubernetes" (their pod's
	// token, answered by the kube pods' auth callout) or "hostPath".
	agentIdentity string
	calloutSecret string // the auth callout's keys, the kube pods' alone
	agentAudience string // the audience of the agents' tokens
}

// agentTokens reports whether the agents sign in with their pods' tokens.
func (a authValues) agentTokens() bool { return a.enabled && a.agentIdentity == "kubernetes" }

// readAuth reads the auth values; one missing is its zero, which the
// checks then find wanting.
func readAuth(vals chartutil.Values) authValues {
	get := func(key string) any {
		v, _ := vals.PathValue(key)
		return v
	}
	var a authValues
	a.enabled, _ = get("auth.enabled").(bool)
	a.servicesSecret, _ = get("auth.servicesSecret").(string)
	a.agentHostPath, _ = get("auth.agentCredentialsHostPath").(string)
	a.agentIdentity, _ = get("auth.agentIdentity").(string)
	a.calloutSecret, _ = get("auth.authCalloutSecret").(string)
	a.agentAudience, _ = get("auth.agentToken.audience").(string)
	switch u := get("agent.runAsUser").(type) {
	case float64:
		a.agentUser = int64(u)
	case int64:
		a.agentUser = u
	case int:
		a.agentUser = int64(u)
	}
	return a
}

// checkIdentities checks which NATS identity each pod can sign in with:
// with auth on, each service Deployment mounts exactly its own seed
// (readable by its user, by no one else) and passes it with --nats-nkey,
// the agent DaemonSet has its pod's NATS token and nothing else
// (auth.agentIdentity kubernetes) or reads its node's seed from the
// node's directory (hostPath, read-only) and no Secret's seed, no pod
// mounts another role's seed, no pod but the Kubernetes service's the
// auth callout's keys, and nothing signs in by password; with auth off,
// no pod has a credential at all.
func checkIdentities(objs []any, vals chartutil.Values) error {
	a := readAuth(vals)
	var errs []error
	seen := map[string]bool{}
	for _, o := range objs {
		var kind, name string
		var spec *corev1.PodSpec
		var labels map[string]string
		switch o := o.(type) {
		case *appsv1.Deployment:
			kind, name, spec, labels = "Deployment", o.Name, &o.Spec.Template.Spec, o.Spec.Template.Labels
		case *appsv1.DaemonSet:
			kind, name, spec, labels = "DaemonSet", o.Name, &o.Spec.Template.Spec, o.Spec.Template.Labels
		case *appsv1.StatefulSet:
			kind, name, spec, labels = "StatefulSet", o.Name, &o.Spec.Template.Spec, o.Spec.Template.Labels
		default:
			continue
		}
		component := labels["app.kubernetes.io/component"]
		role := "other"
		switch {
		case kind == "Deployment" && labels["app.kubernetes.io/name"] == "toposched":
			role = "service"
		case kind == "DaemonSet" && component == "agent":
			role = "agent"
		}
		switch role {
		case "service":
			seen["service "+component] = true
		case "agent":
			seen["agent"] = true
		}
		err := checkNoPasswords(spec)
		if err == nil {
			err = checkSeedRefs(spec, a, role, component)
		}
		if err == nil {
			switch {
			case role == "service":
				err = checkService(spec, a, component)
			case role == "agent":
				err = checkAgent(spec, a)
			case kind == "StatefulSet" && component == "nats":
				err = checkNATSServers(spec, objs, a)
			}
		}
		where := kind + "/" + name
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
	}
	if !seen["agent"] && agentEnabled(vals) {
		errs = append(errs, errors.New("no agent DaemonSet rendered"))
	}
	services, _ := vals.Table("services")
	want := slices.Collect(maps.Keys(services))
	if kubeEnabled(vals) {
		want = append(want, "kube")
	}
	for _, svc := range want {
		if !seen["service "+svc] {
			errs = append(errs, fmt.Errorf("no Deployment of the service %s rendered", svc))
		}
	}
	return errors.Join(errs...)
}

func kubeEnabled(vals chartutil.Values) bool {
	v, _ := vals.PathValue("kube.enabled")
	b, _ := v.(bool)
	return b
}

func agentEnabled(vals chartutil.Values) bool {
	v, _ := vals.PathValue("agent.enabled")
	b, _ := v.(bool)
	return b
}

// containers are a pod's init containers and containers.
func containers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

// credentialFlags are toposched's flags that name a NATS identity.
var credentialFlags = []string{"--nats-nkey", "--nats-creds", "--nats-user", "--nats-password"}

// flagValues are the values given to flag in args (--f=v or --f v).
func flagValues(args []string, flag string) []string {
	var out []string
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			out = append(out, v)
		} else if a == flag && i+1 < len(args) {
			out = append(out, args[i+1])
		}
	}
	return out
}

// checkNoPasswords: no pod signs in by user and password, the identity
// every agent used to share.
func checkNoPasswords(spec *corev1.PodSpec) error {
	var errs []error
	for _, c := range containers(spec) {
		for _, f := range []string{"--nats-user", "--nats-password"} {
			if len(flagValues(append(c.Command, c.Args...), f)) > 0 {
				errs = append(errs, fmt.Errorf("container %s: %s: a password user, not a role's seed", c.Name, f))
			}
		}
		for _, e := range c.Env {
			if e.Name == "TOPOSCHED_NATS_PASSWORD" || e.Name == "TOPOSCHED_NATS_USER" {
				errs = append(errs, fmt.Errorf("container %s: env %s: a password user, not a role's seed", c.Name, e.Name))
			}
		}
	}
	return errors.Join(errs...)
}

// seedItem is one key of the services' Secret a pod's volume holds.
type seedItem struct {
	volume string
	key    string
	path   string // the file's path in the volume
	mode   *int32
}

// seedItems are the keys of secret that spec's volumes hold; a volume of
// the whole Secret (no items) is an error: it holds every service's seed.
func seedItems(spec *corev1.PodSpec, secret string) ([]seedItem, error) {
	var out []seedItem
	var errs []error
	add := func(vol string, items []corev1.KeyToPath, defaultMode *int32) {
		if len(items) == 0 {
			errs = append(errs, fmt.Errorf("volume %s: the whole Secret %s, every service's seed (name the one key in items)", vol, secret))
			return
		}
		for _, it := range items {
			mode := it.Mode
			if mode == nil {
				mode = defaultMode
			}
			out = append(out, seedItem{volume: vol, key: it.Key, path: it.Path, mode: mode})
		}
	}
	for _, v := range spec.Volumes {
		if s := v.Secret; s != nil && s.SecretName == secret {
			add(v.Name, s.Items, s.DefaultMode)
		}
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if s := src.Secret; s != nil && s.Name == secret {
					add(v.Name, s.Items, p.DefaultMode)
				}
			}
		}
	}
	return out, errors.Join(errs...)
}

// checkSeedRefs: the services' seeds reach a pod only as the service's
// own file: never in its environment, and no pod but that service's holds
// a seed; no pod but the agent's mounts the nodes' seed directory. role is
// the pod's: "service" (of service), "agent" or "other".
func checkSeedRefs(spec *corev1.PodSpec, a authValues, role, service string) error {
	if !a.enabled {
		return nil
	}
	var errs []error
	for _, c := range containers(spec) {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && r.SecretKeyRef.Name == a.servicesSecret {
				errs = append(errs, fmt.Errorf("container %s: env %s holds the seed %s", c.Name, e.Name, r.SecretKeyRef.Key))
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == a.servicesSecret {
				errs = append(errs, fmt.Errorf("container %s: envFrom the Secret %s: every service's seed", c.Name, a.servicesSecret))
			}
		}
	}
	items, err := seedItems(spec, a.servicesSecret)
	errs = append(errs, err)
	for _, it := range items {
		if role != "service" || it.key != service+".nk" {
			errs = append(errs, fmt.Errorf("volume %s: the seed %s of another role", it.volume, it.key))
		}
	}
	if a.calloutSecret != "" && !(role == "service" && service == "kube") {
		errs = append(errs, secretRefs(spec, a.calloutSecret, "the auth callout's keys (its issuer signs in as any node's agent)"))
	}
	for _, v := range spec.Volumes {
		if h := v.HostPath; h != nil && path.Clean(h.Path) == path.Clean(a.agentHostPath) && role != "agent" {
			errs = append(errs, fmt.Errorf("volume %s: the node's agent seed directory %s", v.Name, h.Path))
		}
	}
	return errors.Join(errs...)
}

// mountedFile is where container c sees volume vol's file at path p in
// the volume, and whether it is mounted read-only; "" where it is not.
func mountedFile(c *corev1.Container, vol, p string) (string, bool) {
	for _, m := range c.VolumeMounts {
		if m.Name != vol {
			continue
		}
		switch m.SubPath {
		case "":
			return path.Join(m.MountPath, p), m.ReadOnly
		case p:
			return m.MountPath, m.ReadOnly
		}
	}
	return "", false
}

// checkService: the service's Deployment mounts its own seed, and only
// it, readable by its user and no one else, and passes it with
// --nats-nkey.
func checkService(spec *corev1.PodSpec, a authValues, svc string) error {
	var errs []error
	items, _ := seedItems(spec, a.servicesSecret) // errors: checkSeedRefs's
	for _, c := range containers(spec) {
		args := append(slices.Clone(c.Command), c.Args...)
		nkeys := flagValues(args, "--nats-nkey")
		if !a.enabled {
			for _, f := range credentialFlags {
				if len(flagValues(args, f)) > 0 {
					errs = append(errs, fmt.Errorf("container %s: %s with auth off", c.Name, f))
				}
			}
			continue
		}
		if !slices.Contains(args, svc) {
			continue // not the service's container
		}
		if len(nkeys) != 1 {
			errs = append(errs, fmt.Errorf("container %s: %d --nats-nkey flags, want 1: its own seed", c.Name, len(nkeys)))
			continue
		}
		if len(items) != 1 || items[0].key != svc+".nk" {
			errs = append(errs, fmt.Errorf("container %s: seeds %v mounted, want exactly %s.nk", c.Name, items, svc))
			continue
		}
		it := items[0]
		file, ro := mountedFile(c, it.volume, it.path)
		switch {
		case file == "":
			errs = append(errs, fmt.Errorf("container %s: the seed's volume %s is not mounted", c.Name, it.volume))
		case nkeys[0] != file:
			errs = append(errs, fmt.Errorf("container %s: --nats-nkey %s, but its seed is mounted at %s", c.Name, nkeys[0], file))
		case !ro:
			errs = append(errs, fmt.Errorf("container %s: the seed's volume %s is mounted read-write", c.Name, it.volume))
		}
		if err := seedReadable(spec, c, it.mode); err != nil {
			errs = append(errs, fmt.Errorf("container %s: %s: %w", c.Name, it.key, err))
		}
	}
	if a.enabled && len(items) == 0 {
		errs = append(errs, fmt.Errorf("no seed mounted: want %s.nk of the Secret %s", svc, a.servicesSecret))
	}
	return errors.Join(errs...)
}

// seedReadable: a Secret's file is root's, so its user reads it through
// the pod's fsGroup and the group bit; no one else may (Kubernetes'
// default mode 0644 is anyone's).
func seedReadable(spec *corev1.PodSpec, c *corev1.Container, mode *int32) error {
	m := int32(0o644)
	if mode != nil {
		m = *mode
	}
	if m&0o007 != 0 {
		return fmt.Errorf("mode %#o: others may read it", m)
	}
	user := int64(0)
	if sc := spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		user = *sc.RunAsUser
	}
	if sc := c.SecurityContext; sc != nil && sc.RunAsUser != nil {
		user = *sc.RunAsUser
	}
	if user == 0 {
		return nil // root reads it whatever its mode
	}
	if sc := spec.SecurityContext; sc == nil || sc.FSGroup == nil || m&0o040 == 0 {
		return fmt.Errorf("mode %#o and no fsGroup: user %d cannot read it", m, user)
	}
	return nil
}

// checkAgent: the node's agent signs in as its node alone. With
// auth.agentIdentity kubernetes by its pod's token (checkAgentToken);
// with hostPath by its node's own seed, read from the node (a hostPath,
// read-only): no credential flag (the agent finds
// DATA_DIR/credentials/agent-<node>.nk by its node's escaped name), no
// Secret's seed, and the pod runs as the seed file's owner.
func checkAgent(spec *corev1.PodSpec, a authValues) error {
	var errs []error
	for _, v := range spec.Volumes {
		if v.HostPath == nil {
			continue
		}
		for _, c := range containers(spec) {
			for _, m := range c.VolumeMounts {
				if m.Name == v.Name && !m.ReadOnly {
					errs = append(errs, fmt.Errorf("container %s: the host's %s is mounted read-write", c.Name, v.HostPath.Path))
				}
			}
		}
	}
	for _, c := range containers(spec) {
		args := append(slices.Clone(c.Command), c.Args...)
		for _, f := range credentialFlags {
			if len(flagValues(args, f)) > 0 {
				errs = append(errs, fmt.Errorf("container %s: %s: the agent signs in as its node alone (its pod's token, or its node's seed found by its name)", c.Name, f))
			}
		}
		if len(flagValues(args, "--nats-token-file")) > 0 && !a.agentTokens() {
			errs = append(errs, fmt.Errorf("container %s: --nats-token-file with auth.agentIdentity %q", c.Name, a.agentIdentity))
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, "TOPOSCHED_NATS_") && e.Name != "TOPOSCHED_NATS_URL" && !strings.HasPrefix(e.Name, "TOPOSCHED_NATS_TLS_") {
				errs = append(errs, fmt.Errorf("container %s: env %s: the agent signs in as its node alone (its pod's token, or its node's seed found by its name)", c.Name, e.Name))
			}
		}
	}
	var agent *corev1.Container
	for _, c := range containers(spec) {
		if slices.Contains(c.Args, "agent") || slices.Contains(c.Command, "agent") {
			agent = c
		}
	}
	if agent == nil {
		return errors.Join(append(errs, errors.New("no container runs toposched agent"))...)
	}
	var dataDir string
	for _, e := range agent.Env {
		if e.Name == "TOPOSCHED_DATA_DIR" {
			dataDir = e.Value
		}
	}
	var credVol *corev1.Volume
	for i, v := range spec.Volumes {
		if h := v.HostPath; h != nil && a.enabled && path.Clean(h.Path) == path.Clean(a.agentHostPath) {
			credVol = &spec.Volumes[i]
		}
	}
	if !a.enabled {
		if dataDir != "" || credVol != nil {
			errs = append(errs, errors.New("auth off, yet a credentials directory"))
		}
		return errors.Join(errs...)
	}
	if a.agentTokens() {
		if credVol != nil {
			errs = append(errs, fmt.Errorf("volume %s: the nodes' seed directory %s, with auth.agentIdentity kubernetes (the pod's token is its identity)", credVol.Name, a.agentHostPath))
		}
		return errors.Join(append(errs, checkAgentToken(spec, agent, a))...)
	}
	if credVol == nil {
		return errors.Join(append(errs, fmt.Errorf("no hostPath volume of %s: the node's agent seed", a.agentHostPath))...)
	}
	if t := credVol.HostPath.Type; t == nil || *t != corev1.HostPathDirectory {
		errs = append(errs, fmt.Errorf("volume %s: hostPath type %v, want Directory (an unprovisioned node must not start an agent that signs in as no one)", credVol.Name, t))
	}
	if dataDir == "" {
		errs = append(errs, errors.New("no TOPOSCHED_DATA_DIR: the agent would look for its seed in ./toposched-data/credentials"))
	}
	if file, ro := mountedFile(agent, credVol.Name, ""); file != path.Join(dataDir, "credentials") || !ro {
		errs = append(errs, fmt.Errorf("the node's seed directory is mounted at %q (read-only %v), want read-only at TOPOSCHED_DATA_DIR/credentials, %s",
			file, ro, path.Join(dataDir, "credentials")))
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != a.agentUser || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		errs = append(errs, fmt.Errorf("the pod does not run as agent.runAsUser %d, non-root: the seed file's owner", a.agentUser))
	}
	return errors.Join(errs...)
}
