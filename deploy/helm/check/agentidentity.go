package main

import (
	"errors"
	"fmt"
	"path"
	"slices"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// defaultAudience is toposched kube's --agent-token-audience default.
const defaultAudience = "toposched-nats"

// secretRefs: spec refers to secret nowhere (volumes, projections, env),
// what names what the Secret holds.
func secretRefs(spec *corev1.PodSpec, secret, what string) error {
	var errs []error
	for _, v := range spec.Volumes {
		if s := v.Secret; s != nil && s.SecretName == secret {
			errs = append(errs, fmt.Errorf("volume %s: the Secret %s, %s", v.Name, secret, what))
		}
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if s := src.Secret; s != nil && s.Name == secret {
					errs = append(errs, fmt.Errorf("volume %s: the Secret %s, %s", v.Name, secret, what))
				}
			}
		}
	}
	for _, c := range containers(spec) {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && r.SecretKeyRef.Name == secret {
				errs = append(errs, fmt.Errorf("container %s: env %s: the Secret %s, %s", c.Name, e.Name, secret, what))
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil && e.SecretRef.Name == secret {
				errs = append(errs, fmt.Errorf("container %s: envFrom the Secret %s, %s", c.Name, secret, what))
			}
		}
	}
	return errors.Join(errs...)
}

// tokenProjection is a projected ServiceAccount token of a pod's volumes.
type tokenProjection struct {
	volume string
	*corev1.ServiceAccountTokenProjection
}

func tokenProjections(spec *corev1.PodSpec) []tokenProjection {
	var out []tokenProjection
	for _, v := range spec.Volumes {
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if src.ServiceAccountToken != nil {
					out = append(out, tokenProjection{v.Name, src.ServiceAccountToken})
				}
			}
		}
	}
	return out
}

// checkAgentToken: with auth.agentIdentity kubernetes the agent's one
// credential is its pod's token for NATS: a ServiceAccount of its own,
// no API token, exactly one projected token, for an audience that is not
// the API server's, passed with --nats-token-file where it is mounted
// read-only; no seed, no Secret but TLS's, no other token.
func checkAgentToken(spec *corev1.PodSpec, agent *corev1.Container, a authValues) error {
	var errs []error
	if sa := spec.ServiceAccountName; sa == "" || sa == "default" {
		errs = append(errs, errors.New("runs as the namespace's default ServiceAccount: its token would be every pod's that runs as it"))
	}
	if am := spec.AutomountServiceAccountToken; am == nil || *am {
		errs = append(errs, errors.New("automountServiceAccountToken is not false: an API token besides its NATS token"))
	}
	tokens := tokenProjections(spec)
	if len(tokens) != 1 {
		return errors.Join(append(errs, fmt.Errorf("%d projected ServiceAccount tokens, want 1: its NATS token", len(tokens)))...)
	}
	tok := tokens[0]
	switch {
	case tok.Audience == "":
		errs = append(errs, fmt.Errorf("volume %s: a token for the API server's audience, which signs in to Kubernetes too", tok.volume))
	case tok.Audience != a.agentAudience:
		errs = append(errs, fmt.Errorf("volume %s: a token for audience %q, not auth.agentToken.audience %q", tok.volume, tok.Audience, a.agentAudience))
	}
	if e := tok.ExpirationSeconds; e == nil || *e > 3600 {
		errs = append(errs, fmt.Errorf("volume %s: expirationSeconds %v, want at most 3600: a leaked token is someone's sign-in until it expires", tok.volume, e))
	}
	for _, v := range spec.Volumes {
		switch {
		case v.Secret != nil && v.Secret.SecretName != tlsSecretOf(spec):
			errs = append(errs, fmt.Errorf("volume %s: the Secret %s: the agent's one credential is its token", v.Name, v.Secret.SecretName))
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				if src.ServiceAccountToken == nil {
					errs = append(errs, fmt.Errorf("volume %s: projects more than the NATS token", v.Name))
				}
			}
		}
	}
	args := append(slices.Clone(agent.Command), agent.Args...)
	files := flagValues(args, "--nats-token-file")
	file, ro := mountedFile(agent, tok.volume, tok.Path)
	switch {
	case len(files) != 1:
		errs = append(errs, fmt.Errorf("container %s: %d --nats-token-file flags, want 1: the projected token", agent.Name, len(files)))
	case file == "":
		errs = append(errs, fmt.Errorf("container %s: the token's volume %s is not mounted", agent.Name, tok.volume))
	case path.Clean(files[0]) != file:
		errs = append(errs, fmt.Errorf("container %s: --nats-token-file %s, but its token is mounted at %s", agent.Name, files[0], file))
	case !ro:
		errs = append(errs, fmt.Errorf("container %s: the token's volume %s is mounted read-write", agent.Name, tok.volume))
	}
	return errors.Join(errs...)
}

// tlsSecretOf is the Secret mounted at the chart's TLS directory, the one
// Secret every signed-in pod may have ("" when none).
func tlsSecretOf(spec *corev1.PodSpec) string {
	for _, c := range containers(spec) {
		if vol, _ := mountOf(c, "/etc/toposched/tls"); vol != "" {
			if v := volume(spec, vol); v != nil && v.Secret != nil {
				return v.Secret.SecretName
			}
		}
	}
	return ""
}

// checkAgentIdentity: with auth.agentIdentity kubernetes the Kubernetes
// service's pods answer the agents' sign-ins for exactly the agents:
// --agent-service-account is the agent pods' ServiceAccount, rendered and
// bound to no role; --agent-token-audience is their token's audience; the
// issuer seed and the responder's seed are the callout Secret's keys,
// mounted read-only where the flags say, readable by the pod's user and
// no one else. Only the kube pods mount that Secret (checkSeedRefs).
func checkAgentIdentity(objs []any, vals chartutil.Values) error {
	a := readAuth(vals)
	var kube, agent *workload
	ws := workloads(objs)
	for i, w := range ws {
		switch {
		case w.service() == "kube":
			kube = &ws[i]
		case w.kind == "DaemonSet" && w.labels["app.kubernetes.io/component"] == "agent":
			agent = &ws[i]
		}
	}
	if !a.agentTokens() {
		if kube != nil {
			if c := serviceContainer(*kube, "kube"); c != nil && len(flagValues(append(slices.Clone(c.Command), c.Args...), "--auth-callout-issuer-seed")) > 0 {
				return fmt.Errorf("%v: answers the auth callout, yet auth.agentIdentity is %q", kube, a.agentIdentity)
			}
		}
		return nil
	}
	if kube == nil || agent == nil {
		return fmt.Errorf("auth.agentIdentity kubernetes: the Kubernetes service (%v) and the agents (%v) are both needed", kube != nil, agent != nil)
	}
	c := serviceContainer(*kube, "kube")
	if c == nil {
		return fmt.Errorf("%v: no container runs toposched kube", kube)
	}
	args := append(slices.Clone(c.Command), c.Args...)
	one := func(flag string) (string, error) {
		v := flagValues(args, flag)
		if len(v) != 1 {
			return "", fmt.Errorf("%v: container %s: %d %s flags, want 1", kube, c.Name, len(v), flag)
		}
		return v[0], nil
	}
	var errs []error
	sa, err := one("--agent-service-account")
	errs = append(errs, err)
	if want := releaseNamespace + "/" + agent.spec.ServiceAccountName; err == nil && sa != want {
		errs = append(errs, fmt.Errorf("%v: --agent-service-account %s, but the agents run as %s", kube, sa, want))
	}
	audience := defaultAudience
	if v := flagValues(args, "--agent-token-audience"); len(v) > 0 {
		audience = v[len(v)-1]
	}
	for _, tok := range tokenProjections(agent.spec) {
		if tok.Audience != audience {
			errs = append(errs, fmt.Errorf("%v: volume %s: a token for audience %q, but the auth callout (%v) takes %q", agent, tok.volume, tok.Audience, kube, audience))
		}
	}
	rendered := false
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.ServiceAccount:
			rendered = rendered || o.Name == agent.spec.ServiceAccountName
		case *rbacv1.ClusterRoleBinding:
			errs = append(errs, agentNotBound("ClusterRoleBinding/"+o.Name, o.Subjects, agent.spec.ServiceAccountName))
		case *rbacv1.RoleBinding:
			errs = append(errs, agentNotBound("RoleBinding/"+o.Name, o.Subjects, agent.spec.ServiceAccountName))
		}
	}
	if !rendered {
		errs = append(errs, fmt.Errorf("%v: its ServiceAccount %s is not rendered", agent, agent.spec.ServiceAccountName))
	}
	for flag, key := range map[string]string{"--auth-callout-issuer-seed": "auth-callout-issuer.seed", "--auth-callout-nkey": "auth-callout.nk"} {
		file, err := one(flag)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, calloutKeyMounted(*kube, c, a.calloutSecret, key, flag, file))
	}
	return errors.Join(errs...)
}

// agentNotBound: a binding gives no role to the agents' ServiceAccount,
// whose tokens are for NATS alone.
func agentNotBound(where string, subjects []rbacv1.Subject, sa string) error {
	for _, s := range subjects {
		ns := s.Namespace
		if ns == "" {
			ns = releaseNamespace
		}
		if s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && ns == releaseNamespace {
			return fmt.Errorf("%s: gives a role to the agents' ServiceAccount %s, whose tokens are for NATS alone", where, sa)
		}
	}
	return nil
}

// calloutKeyMounted: key of the callout Secret is mounted into c
// read-only at file (flag's value), readable by the pod's user alone.
func calloutKeyMounted(w workload, c *corev1.Container, secret, key, flag, file string) error {
	for _, v := range w.spec.Volumes {
		s := v.Secret
		if s == nil || s.SecretName != secret {
			continue
		}
		for _, it := range s.Items {
			if it.Key != key {
				continue
			}
			at, ro := mountedFile(c, v.Name, it.Path)
			mode := it.Mode
			if mode == nil {
				mode = s.DefaultMode
			}
			switch {
			case at != path.Clean(file):
				return fmt.Errorf("%v: %s %s, but %s of the Secret %s is mounted at %q", w, flag, file, key, secret, at)
			case !ro:
				return fmt.Errorf("%v: %s is mounted read-write", w, key)
			}
			if err := seedReadable(w.spec, c, mode); err != nil {
				return fmt.Errorf("%v: %s: %w", w, key, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%v: %s %s, but no volume holds %s of the Secret %s", w, flag, file, key, secret)
}
