package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// kubeRulesFile holds the Kubernetes service's ClusterRole rules; the e2e
// tests grant exactly these on a real API server, so the chart must ship
// them and nothing else.
const kubeRulesFile = "files/kube-rules.yaml"

// workload is a pod template the chart renders.
type workload struct {
	kind, name string
	spec       *corev1.PodSpec
	labels     map[string]string
}

func (w workload) String() string { return w.kind + "/" + w.name }

// service is the toposched service w runs ("" when w is not one of
// toposched's service Deployments).
func (w workload) service() string {
	if w.kind != "Deployment" || w.labels["app.kubernetes.io/name"] != "toposched" {
		return ""
	}
	return w.labels["app.kubernetes.io/component"]
}

func workloads(objs []any) []workload {
	var out []workload
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{"Deployment", o.Name, &o.Spec.Template.Spec, o.Spec.Template.Labels})
		case *appsv1.DaemonSet:
			out = append(out, workload{"DaemonSet", o.Name, &o.Spec.Template.Spec, o.Spec.Template.Labels})
		case *appsv1.StatefulSet:
			out = append(out, workload{"StatefulSet", o.Name, &o.Spec.Template.Spec, o.Spec.Template.Labels})
		}
	}
	return out
}

// serviceContainer is the container of w that runs svc (toposched SVC ...).
func serviceContainer(w workload, svc string) *corev1.Container {
	for _, c := range containers(w.spec) {
		args := append(slices.Clone(c.Command), c.Args...)
		if slices.Contains(args, svc) {
			return c
		}
	}
	return nil
}

// kubeRules reads the rules the chart's ClusterRole must have.
func kubeRules(dir string) ([]rbacv1.PolicyRule, error) {
	b, err := os.ReadFile(filepath.Join(dir, kubeRulesFile))
	if err != nil {
		return nil, err
	}
	var rules []rbacv1.PolicyRule
	if err := yaml.UnmarshalStrict(b, &rules); err != nil {
		return nil, fmt.Errorf("%s: %w", kubeRulesFile, err)
	}
	if len(rules) == 0 {
		return nil, fmt.Errorf("%s: no rules", kubeRulesFile)
	}
	return rules, nil
}

func ruleString(r rbacv1.PolicyRule) string {
	s := fmt.Sprintf("groups %q resources %q verbs %q", r.APIGroups, r.Resources, r.Verbs)
	if len(r.ResourceNames) > 0 {
		s += fmt.Sprintf(" names %q", r.ResourceNames)
	}
	if len(r.NonResourceURLs) > 0 {
		s += fmt.Sprintf(" urls %q", r.NonResourceURLs)
	}
	return s
}

// rulesDiff says how got differs from want, rule by rule.
func rulesDiff(got, want []rbacv1.PolicyRule) string {
	var out []string
	for _, r := range got {
		if !slices.ContainsFunc(want, func(w rbacv1.PolicyRule) bool { return reflect.DeepEqual(r, w) }) {
			out = append(out, "extra: "+ruleString(r))
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(r rbacv1.PolicyRule) bool { return reflect.DeepEqual(r, w) }) {
			out = append(out, "missing: "+ruleString(w))
		}
	}
	if len(out) == 0 {
		out = append(out, "the same rules in another order or repeated")
	}
	return strings.Join(out, "; ")
}

// checkKube checks what the Kubernetes service may do and with whose
// token: its ClusterRole's rules are exactly files/kube-rules.yaml's, and
// every binding of it gives it to the service's own ServiceAccount alone;
// the service's pod runs as that ServiceAccount with its token, which no
// other pod has (the chart's other pods mount no token at all: they need
// no Kubernetes API), and holds no Secret but its own seed and the TLS
// one; each of its replicas names itself by its pod in the lease "kube",
// whose TTL is placement's (one bucket); and the agents run on the nodes
// dedicated to toposched. With kube.enabled off none of it is rendered.
func checkKube(objs []any, vals chartutil.Values, dir string) error {
	var kube *workload
	ws := workloads(objs)
	for i, w := range ws {
		if w.service() == "kube" {
			kube = &ws[i]
		}
	}
	var roles []*rbacv1.ClusterRole
	var bindings []any
	var accounts []string
	for _, o := range objs {
		switch o := o.(type) {
		case *rbacv1.ClusterRole:
			roles = append(roles, o)
		case *rbacv1.ClusterRoleBinding, *rbacv1.RoleBinding:
			bindings = append(bindings, o)
		case *corev1.ServiceAccount:
			accounts = append(accounts, o.Name)
		}
	}
	if !kubeEnabled(vals) {
		if kube != nil || len(roles) > 0 {
			return fmt.Errorf("kube.enabled is false, yet the Kubernetes service's Deployment (%v) or a ClusterRole (%d) is rendered", kube != nil, len(roles))
		}
		return nil
	}
	if kube == nil {
		return nil // checkIdentities says it is missing
	}
	var errs []error
	want, err := kubeRules(dir)
	if err != nil {
		return err
	}
	if len(roles) != 1 {
		return fmt.Errorf("%d ClusterRoles rendered, want 1: the Kubernetes service's, of %s", len(roles), kubeRulesFile)
	}
	role := roles[0]
	if !reflect.DeepEqual(role.Rules, want) {
		errs = append(errs, fmt.Errorf("ClusterRole/%s: its rules are not %s's (%s)", role.Name, kubeRulesFile, rulesDiff(role.Rules, want)))
	}
	if role.AggregationRule != nil {
		errs = append(errs, fmt.Errorf("ClusterRole/%s: an aggregationRule gives it the rules of other ClusterRoles", role.Name))
	}

	sa := kube.spec.ServiceAccountName
	switch {
	case sa == "" || sa == "default":
		errs = append(errs, fmt.Errorf("%v: runs as the namespace's default ServiceAccount, not its own", kube))
	case !slices.Contains(accounts, sa):
		errs = append(errs, fmt.Errorf("%v: its ServiceAccount %s is not rendered", kube, sa))
	}
	own := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: releaseNamespace}
	bound := false
	for _, b := range bindings {
		var where string
		var ref rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch b := b.(type) {
		case *rbacv1.ClusterRoleBinding:
			where, ref, subjects = "ClusterRoleBinding/"+b.Name, b.RoleRef, b.Subjects
		case *rbacv1.RoleBinding:
			if b.RoleRef.Kind == "Role" {
				continue // a namespace's Role: the credentials' hook's (checkIssue)
			}
			where, ref, subjects = "RoleBinding/"+b.Name, b.RoleRef, b.Subjects
		}
		if ref != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
			errs = append(errs, fmt.Errorf("%s: binds %s %s, not the Kubernetes service's ClusterRole %s", where, ref.Kind, ref.Name, role.Name))
			continue
		}
		for _, s := range subjects {
			if s.Namespace == "" && s.Kind == rbacv1.ServiceAccountKind {
				s.Namespace = releaseNamespace // a RoleBinding's own
			}
			if s != own {
				errs = append(errs, fmt.Errorf("%s: gives the ClusterRole to %s %s/%s, not the Kubernetes service's ServiceAccount %s/%s",
					where, s.Kind, s.Namespace, s.Name, own.Namespace, own.Name))
				continue
			}
			if _, ok := b.(*rbacv1.ClusterRoleBinding); ok {
				bound = true
			}
		}
	}
	if !bound {
		errs = append(errs, fmt.Errorf("no ClusterRoleBinding gives ClusterRole %s to the ServiceAccount %s/%s", role.Name, own.Namespace, own.Name))
	}
	if a := kube.spec.AutomountServiceAccountToken; a != nil && !*a {
		errs = append(errs, fmt.Errorf("%v: automountServiceAccountToken false: no token for --kubeconfig=in-cluster", kube))
	}
	for _, w := range ws {
		if w.spec == kube.spec {
			continue
		}
		if w.spec.ServiceAccountName == sa && sa != "" {
			errs = append(errs, fmt.Errorf("%v: runs as the Kubernetes service's ServiceAccount %s, with its rights", w, sa))
		}
		if a := w.spec.AutomountServiceAccountToken; w.labels["app.kubernetes.io/name"] == "toposched" && (a == nil || *a) {
			errs = append(errs, fmt.Errorf("%v: mounts a ServiceAccount token, and needs no Kubernetes API (automountServiceAccountToken: false)", w))
		}
	}
	errs = append(errs, kubeSecrets(*kube, vals))
	errs = append(errs, checkLease(ws))
	errs = append(errs, checkDedicated(ws, *kube))
	return errors.Join(errs...)
}

// kubeSecrets: the Kubernetes service's pod holds no Secret but its seed's
// (checkIdentities checks it is kube.nk alone) and the TLS one: not the
// token of another ServiceAccount, nor any other credential.
func kubeSecrets(kube workload, vals chartutil.Values) error {
	a := readAuth(vals)
	var allowed []string
	if a.enabled {
		allowed = append(allowed, a.servicesSecret)
	}
	if a.agentTokens() {
		allowed = append(allowed, a.calloutSecret)
	}
	if on, _ := vals.PathValue("tls.enabled"); on.(bool) {
		name, _ := vals.PathValue("tls.secretName")
		if s, ok := name.(string); ok {
			allowed = append(allowed, s)
		}
	}
	var errs []error
	refuse := func(where, secret string) {
		if !slices.Contains(allowed, secret) {
			errs = append(errs, fmt.Errorf("%v: %s: the Secret %s, not the Kubernetes service's seed or TLS (its only token is its own ServiceAccount's)", kube, where, secret))
		}
	}
	for _, v := range kube.spec.Volumes {
		if s := v.Secret; s != nil {
			refuse("volume "+v.Name, s.SecretName)
		}
		if p := v.Projected; p != nil {
			for _, src := range p.Sources {
				if s := src.Secret; s != nil {
					refuse("volume "+v.Name, s.Name)
				}
				if t := src.ServiceAccountToken; t != nil && t.Audience != "" {
					errs = append(errs, fmt.Errorf("%v: volume %s: a token for audience %s", kube, v.Name, t.Audience))
				}
			}
		}
	}
	for _, c := range containers(kube.spec) {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
				refuse("container "+c.Name+" env "+e.Name, r.SecretKeyRef.Name)
			}
		}
		for _, e := range c.EnvFrom {
			if e.SecretRef != nil {
				refuse("container "+c.Name+" envFrom", e.SecretRef.Name)
			}
		}
	}
	return errors.Join(errs...)
}

// leased are the services whose replicas campaign for a lease in the one
// lease bucket.
var leased = []string{"placement", "kube"}

// checkLease: each replica of a leased service names itself by its pod
// (two replicas of one name would both think they hold the lease), and
// all give the bucket the same TTL.
func checkLease(ws []workload) error {
	var errs []error
	ttls := map[string]time.Duration{}
	for _, w := range ws {
		svc := w.service()
		if !slices.Contains(leased, svc) {
			continue
		}
		c := serviceContainer(w, svc)
		if c == nil {
			errs = append(errs, fmt.Errorf("%v: no container runs toposched %s", w, svc))
			continue
		}
		if err := replicaName(c); err != nil {
			errs = append(errs, fmt.Errorf("%v: container %s: %w", w, c.Name, err))
		}
		args := append(slices.Clone(c.Command), c.Args...)
		v := flagValues(args, "--lease-ttl")
		if len(v) != 1 {
			errs = append(errs, fmt.Errorf("%v: %d --lease-ttl flags, want 1 (the lease bucket's TTL is every leased service's)", w, len(v)))
			continue
		}
		d, err := time.ParseDuration(v[0])
		if err != nil {
			errs = append(errs, fmt.Errorf("%v: --lease-ttl %q: %w", w, v[0], err))
			continue
		}
		ttls[svc] = d
	}
	if len(ttls) == len(leased) && ttls["kube"] != ttls["placement"] {
		errs = append(errs, fmt.Errorf("--lease-ttl: kube %v, placement %v: the lease bucket is one, its TTL the same for both", ttls["kube"], ttls["placement"]))
	}
	return errors.Join(errs...)
}

// replicaName: the container's --replica (or, without it,
// TOPOSCHED_REPLICA) is its pod's name, through the downward API.
func replicaName(c *corev1.Container) error {
	podName := func(name string) bool {
		for _, e := range c.Env {
			if e.Name == name && e.Value == "" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
				return true
			}
		}
		return false
	}
	v := flagValues(append(slices.Clone(c.Command), c.Args...), "--replica")
	switch len(v) {
	case 0:
		if !podName("TOPOSCHED_REPLICA") {
			return errors.New("no --replica and no TOPOSCHED_REPLICA of the pod's name: every replica would be host/pid, a restarted one not taking its lease back")
		}
		return nil
	case 1:
		name, ok := strings.CutPrefix(v[0], "$(")
		if name, ok2 := strings.CutSuffix(name, ")"); ok && ok2 && podName(name) {
			return nil
		}
		return fmt.Errorf("--replica %s: not $(VAR) of an env VAR from the pod's metadata.name: replicas must differ", v[0])
	}
	return fmt.Errorf("%d --replica flags", len(v))
}

// checkDedicated: the agent DaemonSet, which publishes the topology of
// the GPU nodes, tolerates the taint that dedicates nodes to toposched's
// pods (else the dedicated nodes, the ones toposched schedules, would have
// no agent).
func checkDedicated(ws []workload, kube workload) error {
	c := serviceContainer(kube, "kube")
	if c == nil {
		return fmt.Errorf("%v: no container runs toposched kube", kube)
	}
	key := "toposched.io/dedicated" // the service's default
	if v := flagValues(append(slices.Clone(c.Command), c.Args...), "--dedicated-taint"); len(v) > 0 {
		key = v[len(v)-1]
	}
	taint := corev1.Taint{Key: key, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	for _, w := range ws {
		if w.kind != "DaemonSet" || w.labels["app.kubernetes.io/component"] != "agent" {
			continue
		}
		if !slices.ContainsFunc(w.spec.Tolerations, func(t corev1.Toleration) bool { return tolerates(t, taint) }) {
			return fmt.Errorf("%v: does not tolerate %s=true:NoSchedule, the nodes dedicated to toposched (--dedicated-taint): they would have no agent", w, key)
		}
	}
	return nil
}

// tolerates is Kubernetes' rule (core/v1 Toleration.ToleratesTaint).
func tolerates(t corev1.Toleration, taint corev1.Taint) bool {
	if t.Effect != "" && t.Effect != taint.Effect {
		return false
	}
	if t.Key != "" && t.Key != taint.Key {
		return false
	}
	switch t.Operator {
	case corev1.TolerationOpExists:
		return true
	case "", corev1.TolerationOpEqual:
		return t.Key != "" && t.Value == taint.Value
	}
	return false
}

// serviceMonitor is what the check reads of a Prometheus Operator
// ServiceMonitor: the Services it selects and the ports it scrapes.
type serviceMonitor struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels      map[string]string `json:"matchLabels"`
			MatchExpressions []any             `json:"matchExpressions"`
		} `json:"selector"`
		Endpoints []struct {
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// subset reports whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkMetrics: every service (the Kubernetes service too) serves its
// metrics, health and readiness where the chart says: --metrics-listen's
// port is the container's port "metrics", the probes ask /healthz and
// /readyz on it, a Service selects the pod on it, and each ServiceMonitor
// rendered selects that Service and scrapes the port.
func checkMetrics(objs []any) error {
	var services []*corev1.Service
	var monitors []*serviceMonitor
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Service:
			services = append(services, o)
		case *serviceMonitor:
			monitors = append(monitors, o)
		}
	}
	var errs []error
	for _, w := range workloads(objs) {
		svc := w.service()
		if svc == "" {
			continue
		}
		if err := checkServiceMetrics(w, svc, services, monitors); err != nil {
			errs = append(errs, fmt.Errorf("%v: %w", w, err))
		}
	}
	return errors.Join(errs...)
}

func checkServiceMetrics(w workload, svc string, services []*corev1.Service, monitors []*serviceMonitor) error {
	c := serviceContainer(w, svc)
	if c == nil {
		return fmt.Errorf("no container runs toposched %s", svc)
	}
	v := flagValues(append(slices.Clone(c.Command), c.Args...), "--metrics-listen")
	if len(v) != 1 {
		return fmt.Errorf("container %s: %d --metrics-listen flags, want 1", c.Name, len(v))
	}
	_, p, err := net.SplitHostPort(v[0])
	if err != nil {
		return fmt.Errorf("container %s: --metrics-listen %s: %w", c.Name, v[0], err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return fmt.Errorf("container %s: --metrics-listen %s: port %q", c.Name, v[0], p)
	}
	var errs []error
	i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == "metrics" })
	if i < 0 || int(c.Ports[i].ContainerPort) != port {
		errs = append(errs, fmt.Errorf("container %s: no port \"metrics\" %d, where --metrics-listen serves", c.Name, port))
	}
	probe := func(what string, pr *corev1.Probe, path string) {
		ok := pr != nil && pr.HTTPGet != nil && pr.HTTPGet.Path == path &&
			(pr.HTTPGet.Port.String() == "metrics" || pr.HTTPGet.Port.IntValue() == port)
		if !ok {
			errs = append(errs, fmt.Errorf("container %s: %s probe is not GET %s on the metrics port", c.Name, what, path))
		}
	}
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("readiness", c.ReadinessProbe, "/readyz")

	// The Services that reach the pod's metrics port, by the port's name.
	reach := map[*corev1.Service][]string{}
	for _, s := range services {
		if len(s.Spec.Selector) == 0 || !subset(s.Spec.Selector, w.labels) {
			continue
		}
		for _, sp := range s.Spec.Ports {
			t := sp.TargetPort
			// Unset, the target is the Service's own port.
			if t.String() == "metrics" || t.IntValue() == port || (t.String() == "0" && int(sp.Port) == port) {
				reach[s] = append(reach[s], sp.Name)
			}
		}
	}
	if len(reach) == 0 {
		errs = append(errs, fmt.Errorf("no Service selects the pod on its metrics port %d", port))
	}
	for _, m := range monitors {
		if len(m.Spec.Selector.MatchExpressions) > 0 {
			errs = append(errs, fmt.Errorf("ServiceMonitor/%s: matchExpressions, which this check does not evaluate", m.Metadata.Name))
			continue
		}
		scraped := false
		for s, names := range reach {
			if !subset(m.Spec.Selector.MatchLabels, s.Labels) {
				continue
			}
			for _, e := range m.Spec.Endpoints {
				if slices.Contains(names, e.Port) && (e.Path == "" || e.Path == "/metrics") {
					scraped = true
				}
			}
		}
		if !scraped {
			errs = append(errs, fmt.Errorf("ServiceMonitor/%s does not scrape it: no endpoint port of a Service it selects reaches the pod's /metrics", m.Metadata.Name))
		}
	}
	return errors.Join(errs...)
}
