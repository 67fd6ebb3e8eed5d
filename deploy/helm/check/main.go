// Command check renders the toposched Helm chart with helm's own engine
// and validates every manifest against the Kubernetes API types: each
// document is decoded strictly (unknown fields and wrong types are errors)
// into its k8s.io/api type. Kinds outside k8s.io/api (the Prometheus
// Operator's ServiceMonitor) are checked for apiVersion, kind and name.
//
// It is a module of its own so that helm's and Kubernetes' dependencies
// stay out of toposched's go.mod. The NATS subchart is the official one,
// fetched by `helm dependency update`; without network it cannot be
// rendered here, so the check renders with nats.enabled=false.
//
// Usage: go run . CHART_DIR   (from deploy/helm/check; .ci/run does it)
package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// valueSets are the configurations rendered: the defaults, and one with
// every optional part on.
var valueSets = map[string]map[string]any{
	"defaults": {"nats": map[string]any{"enabled": false}},
	"secured": {
		"nats":     map[string]any{"enabled": false},
		"auth":     map[string]any{"enabled": true, "existingSecret": "toposched-nats"},
		"tls":      map[string]any{"enabled": true, "secretName": "toposched-nats-tls"},
		"policies": map[string]any{"lab.rego": "package toposched.nodes\n"},
		"metrics":  map[string]any{"serviceMonitor": map[string]any{"enabled": false}},
	},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: check CHART_DIR")
		os.Exit(2)
	}
	names := make([]string, 0, len(valueSets))
	for n := range valueSets {
		names = append(names, n)
	}
	sort.Strings(names)
	failed := false
	for _, n := range names {
		kinds, err := check(os.Args[1], valueSets[n])
		if err != nil {
			failed = true
			fmt.Fprintf(os.Stderr, "chart %s with %s values:\n%v\n", os.Args[1], n, err)
			continue
		}
		fmt.Printf("chart %s with %s values: %s valid\n", os.Args[1], n, strings.Join(kinds, ", "))
	}
	if failed {
		os.Exit(1)
	}
}

// check renders the chart with vals and validates each document.
func check(dir string, vals map[string]any) ([]string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	if err := chartutil.ProcessDependenciesWithMerge(ch, vals); err != nil {
		return nil, fmt.Errorf("dependencies: %w", err)
	}
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: "t", Namespace: "toposched", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	files := make([]string, 0, len(out))
	for f := range out {
		files = append(files, f)
	}
	sort.Strings(files)
	var errs []error
	var kinds []string
	for _, f := range files {
		if !strings.HasSuffix(f, ".yaml") {
			continue
		}
		for i, doc := range bytes.Split([]byte(out[f]), []byte("\n---")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			kind, err := validate(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s #%d: %w\n%s", f, i, err, doc))
				continue
			}
			kinds = append(kinds, kind)
		}
	}
	return kinds, errors.Join(errs...)
}

func validate(doc []byte) (string, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return "", fmt.Errorf("not YAML: %w", err)
	}
	if head.APIVersion == "" || head.Kind == "" || head.Metadata.Name == "" {
		return "", errors.New("apiVersion, kind and metadata.name are required")
	}
	var v any
	switch head.APIVersion + "/" + head.Kind {
	case "v1/ConfigMap":
		v = &corev1.ConfigMap{}
	case "v1/Service":
		v = &corev1.Service{}
	case "v1/Secret":
		v = &corev1.Secret{}
	case "apps/v1/Deployment":
		v = &appsv1.Deployment{}
	case "apps/v1/DaemonSet":
		v = &appsv1.DaemonSet{}
	case "monitoring.coreos.com/v1/ServiceMonitor":
		return head.Kind + "/" + head.Metadata.Name + " (CRD: shape only)", nil
	default:
		return "", fmt.Errorf("%s %s: no schema known to this check", head.APIVersion, head.Kind)
	}
	if err := yaml.UnmarshalStrict(doc, v); err != nil {
		return "", fmt.Errorf("%s %s: %w", head.Kind, head.Metadata.Name, err)
	}
	return head.Kind + "/" + head.Metadata.Name, nil
}
