// Command check renders the toposched Helm chart with helm's own engine
// and validates every manifest against the Kubernetes API types: each
// document is decoded strictly (unknown fields and wrong types are errors)
// into its k8s.io/api type. Kinds outside k8s.io/api (the Prometheus
// Operator's ServiceMonitor) are checked for apiVersion, kind and name.
// Then it checks who each pod signs in to NATS as (identity.go): each
// service its own seed and no other, each node's agent its node's, from
// its pod's token or from the node; that the agents' tokens are the ones
// the Kubernetes service's auth callout takes, whose keys no other pod has
// (agentidentity.go); and the Kubernetes service (kube.go): its
// ClusterRole is files/kube-rules.yaml, bound to its own ServiceAccount,
// which no other pod has, and every service is behind the metrics Service
// the ServiceMonitor scrapes.
//
// It is a module of its own so that helm's and Kubernetes' dependencies
// stay out of toposched's go.mod. The NATS subchart is the official one,
// fetched by `helm dependency update`; without it (CI has no copy) the
// check renders with nats.enabled=false, and where charts/ holds it, with
// the subchart too, checking that its servers take toposched's users in
// (natsconf.go).
//
// Usage: go run . CHART_DIR   (from deploy/helm/check; .ci/run does it)
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// valueSet is one configuration rendered: values files of the chart's
// directory, then values given here (helm install -f FILE --set ...).
type valueSet struct {
	files []string
	vals  map[string]any
}

// valueSets are the configurations rendered: the defaults (NATS
// identities on, the agents' from their pods' tokens), the insecure lab's,
// one with every optional part on, one without the Kubernetes service, and
// one with the agents' seeds provisioned on the nodes.
var valueSets = map[string]valueSet{
	"defaults": {vals: map[string]any{"nats": map[string]any{"enabled": false}}},
	"insecure": {files: []string{"values-insecure.yaml"}, vals: map[string]any{"nats": map[string]any{"enabled": false}}},
	"secured": {vals: map[string]any{
		"nats": map[string]any{"enabled": false},
		"auth": map[string]any{"servicesSecret": "site-seeds", "authCalloutSecret": "site-callout", "agentToken": map[string]any{"audience": "nats.example.com"},
			"adminSecret": "site-admin", "tenantSecretPrefix": "site-tenant-", "tenants": []any{"research", "Research Lab", "ml-research", "研究"}},
		"tls":      map[string]any{"enabled": true, "secretName": "toposched-nats-tls"},
		"policies": map[string]any{"lab.rego": "package toposched.nodes\n"},
		"metrics":  map[string]any{"serviceMonitor": map[string]any{"enabled": false}},
		"kube":     map[string]any{"gpuClasses": []any{"gpu.nvidia.com", "mig.nvidia.com"}, "resources": map[string]any{"limits": map[string]any{"memory": "4Gi"}}},
		"services": map[string]any{"placement": map[string]any{"computeReference": "a100"}},
	}},
	// The Secrets made by the administrator, the agents' identity from
	// their tokens.
	"issue-off": {vals: map[string]any{"nats": map[string]any{"enabled": false}, "auth": map[string]any{"issue": false}}},
	"kube-off":  {vals: map[string]any{"nats": map[string]any{"enabled": false}, "kube": map[string]any{"enabled": false}, "auth": map[string]any{"agentIdentity": "hostPath", "issue": false}}},
	// Each node's seed from the node, as sites provision it, and the
	// Secrets made by the administrator.
	"agent-hostpath": {vals: map[string]any{
		"nats": map[string]any{"enabled": false},
		"auth": map[string]any{"agentIdentity": "hostPath", "agentCredentialsHostPath": "/var/lib/site/toposched", "issue": false},
		"tls":  map[string]any{"enabled": true, "secretName": "toposched-nats-tls"},
	}},
}

// releaseNamespace is the namespace the chart is rendered into.
const releaseNamespace = "toposched"

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: check CHART_DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	names := make([]string, 0, len(valueSets))
	for n := range valueSets {
		names = append(names, n)
	}
	sort.Strings(names)
	failed := false
	report := func(what string, kinds []string, err error) {
		if err != nil {
			failed = true
			fmt.Fprintf(os.Stderr, "chart %s with %s:\n%v\n", dir, what, err)
			return
		}
		fmt.Printf("chart %s with %s: %s valid\n", dir, what, strings.Join(kinds, ", "))
	}
	for _, n := range names {
		kinds, err := check(dir, valueSets[n])
		report(n+" values", kinds, err)
	}
	// The NATS subchart, where helm dependency update has fetched it.
	sub, err := natsSubchart(dir)
	switch {
	case err != nil:
		report("the NATS subchart", nil, err)
	case sub == "":
		fmt.Printf("chart %s: the NATS subchart is not in charts/ (helm dependency update fetches it): its servers' users are not checked\n", dir)
	default:
		for _, n := range []string{"defaults", "insecure"} {
			vs := valueSets[n]
			vs.vals = withNATS(vs.vals)
			kinds, err := check(dir, vs)
			report(n+" values and "+sub, kinds, err)
		}
	}
	if failed {
		os.Exit(1)
	}
}

// check renders the chart with vs, validates each document and checks
// which NATS identity each pod signs in with.
func check(dir string, vs valueSet) ([]string, error) {
	out, vals, err := render(dir, vs)
	if err != nil {
		return nil, err
	}
	files := make([]string, 0, len(out))
	for f := range out {
		files = append(files, f)
	}
	sort.Strings(files)
	var errs []error
	var kinds []string
	var objs []any
	for _, f := range files {
		if !strings.HasSuffix(f, ".yaml") {
			continue
		}
		for i, doc := range bytes.Split([]byte(out[f]), []byte("\n---")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			kind, obj, err := validate(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s #%d: %w\n%s", f, i, err, doc))
				continue
			}
			kinds = append(kinds, kind)
			objs = append(objs, obj)
		}
	}
	if len(errs) == 0 {
		errs = append(errs, checkIdentities(objs, vals), checkKube(objs, vals, dir), checkAgentIdentity(objs, vals), checkMetrics(objs), checkIssue(objs, vals))
	}
	return kinds, errors.Join(errs...)
}

// render renders the chart with vs as helm install would, returning the
// manifests by file and the values the templates saw.
func render(dir string, vs valueSet) (map[string]string, chartutil.Values, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("load: %w", err)
	}
	user := map[string]any{}
	for _, f := range vs.files {
		v, err := chartutil.ReadValuesFile(filepath.Join(dir, f))
		if err != nil {
			return nil, nil, fmt.Errorf("values %s: %w", f, err)
		}
		user = mergeMaps(user, v)
	}
	user = mergeMaps(user, deepCopy(vs.vals))
	if err := chartutil.ProcessDependenciesWithMerge(ch, user); err != nil {
		return nil, nil, fmt.Errorf("dependencies: %w", err)
	}
	rv, err := chartutil.ToRenderValues(ch, user, chartutil.ReleaseOptions{Name: "t", Namespace: releaseNamespace, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, nil, fmt.Errorf("render: %w", err)
	}
	vals, err := rv.Table("Values")
	if err != nil {
		return nil, nil, fmt.Errorf("values: %w", err)
	}
	return out, vals, nil
}

// mergeMaps is helm's merge of -f files and --set values (pkg/cli/values):
// b's values win, maps merge key by key.
func mergeMaps(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if v, ok := v.(map[string]any); ok {
			if bv, ok := out[k].(map[string]any); ok {
				out[k] = mergeMaps(bv, v)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// deepCopy copies a values tree, so that merging never changes a set.
func deepCopy(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			v = deepCopy(sub)
		}
		out[k] = v
	}
	return out
}

// validate decodes doc strictly into its Kubernetes type, returning
// "Kind/name" and the decoded object.
func validate(doc []byte) (string, any, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return "", nil, fmt.Errorf("not YAML: %w", err)
	}
	if head.APIVersion == "" || head.Kind == "" || head.Metadata.Name == "" {
		return "", nil, errors.New("apiVersion, kind and metadata.name are required")
	}
	var v any
	switch head.APIVersion + "/" + head.Kind {
	case "v1/ConfigMap":
		v = &corev1.ConfigMap{}
	case "v1/Service":
		v = &corev1.Service{}
	case "v1/Secret":
		v = &corev1.Secret{}
	case "v1/Pod":
		v = &corev1.Pod{}
	case "v1/ServiceAccount":
		v = &corev1.ServiceAccount{}
	case "apps/v1/Deployment":
		v = &appsv1.Deployment{}
	case "apps/v1/DaemonSet":
		v = &appsv1.DaemonSet{}
	case "apps/v1/StatefulSet":
		v = &appsv1.StatefulSet{}
	case "batch/v1/Job":
		v = &batchv1.Job{}
	case "policy/v1/PodDisruptionBudget":
		v = &policyv1.PodDisruptionBudget{}
	case "rbac.authorization.k8s.io/v1/ClusterRole":
		v = &rbacv1.ClusterRole{}
	case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
		v = &rbacv1.ClusterRoleBinding{}
	case "rbac.authorization.k8s.io/v1/Role":
		v = &rbacv1.Role{}
	case "rbac.authorization.k8s.io/v1/RoleBinding":
		v = &rbacv1.RoleBinding{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		// A CRD: its shape, and what it scrapes (kube.go).
		m := &serviceMonitor{}
		if err := yaml.Unmarshal(doc, m); err != nil {
			return "", nil, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
		}
		return head.Kind + "/" + head.Metadata.Name + " (CRD: shape and selector only)", m, nil
	case "monitoring.coreos.com/v1/PodMonitor":
		return head.Kind + "/" + head.Metadata.Name + " (CRD: shape only)", nil, nil
	default:
		return "", nil, fmt.Errorf("%s %s: no schema known to this check", head.APIVersion, head.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
	}
	return head.Kind + "/" + head.Metadata.Name, v, nil
}
