package main

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// natsSubchart names the NATS chart in dir's charts/ (what helm
// dependency update fetched), "" when there is none.
func natsSubchart(dir string) (string, error) {
	tgz, err := filepath.Glob(filepath.Join(dir, "charts", "nats-*.tgz"))
	if err != nil {
		return "", err
	}
	if len(tgz) > 0 {
		return filepath.Base(tgz[0]), nil
	}
	if _, err := os.Stat(filepath.Join(dir, "charts", "nats", "Chart.yaml")); err == nil {
		return "charts/nats", nil
	}
	return "", nil
}

// withNATS is vals with the NATS subchart on.
func withNATS(vals map[string]any) map[string]any {
	return mergeMaps(deepCopy(vals), map[string]any{"nats": map[string]any{"enabled": true}})
}

// includeLine is a nats.conf include directive (the NATS chart writes
// keys ending in $include as `include FILE;`).
var includeLine = regexp.MustCompile(`(?m)^\s*include\s+"?([^";\s]+)"?\s*;?\s*$`)

// checkNATSServers: with auth on, the NATS servers' configuration
// includes a file of a mounted Secret (roles.conf: toposched's users),
// the reloader watches it, and the system account's password, which it
// reads from the environment, comes from a Secret; with auth off it
// includes nothing of the kind.
func checkNATSServers(spec *corev1.PodSpec, objs []any, a authValues) error {
	var nats, reloader *corev1.Container
	for _, c := range containers(spec) {
		switch c.Name {
		case "nats":
			nats = c
		case "reloader":
			reloader = c
		}
	}
	if nats == nil {
		return errors.New("no nats container")
	}
	confs := flagValues(nats.Args, "--config")
	if len(confs) != 1 {
		return fmt.Errorf("nats container args %v: want one --config", nats.Args)
	}
	conf := confs[0]
	text, err := configMapFile(spec, nats, objs, conf)
	if err != nil {
		return err
	}
	var includes []string
	for _, m := range includeLine.FindAllStringSubmatch(text, -1) {
		includes = append(includes, path.Join(path.Dir(conf), m[1]))
	}
	var sysPassword *corev1.EnvVar
	for i, e := range nats.Env {
		if e.Name == "NATS_SYS_PASSWORD" {
			sysPassword = &nats.Env[i]
		}
	}
	if !a.enabled {
		if len(includes) > 0 || sysPassword != nil {
			return fmt.Errorf("auth off, yet nats.conf includes %v (NATS_SYS_PASSWORD %v)", includes, sysPassword != nil)
		}
		return nil
	}
	var errs []error
	users := ""
	for _, inc := range includes {
		vol, ro := mountOf(nats, path.Dir(inc))
		v := volume(spec, vol)
		if v == nil || v.Secret == nil {
			continue
		}
		users = inc
		if !ro {
			errs = append(errs, fmt.Errorf("nats container: %s is mounted read-write", path.Dir(inc)))
		}
		if reloader != nil {
			if rv, _ := mountOf(reloader, path.Dir(inc)); rv != vol {
				errs = append(errs, fmt.Errorf("reloader container: %s is not mounted: a new user would wait for a restart", path.Dir(inc)))
			}
			if !slices.Contains(flagValues(reloader.Args, "-config"), inc) {
				errs = append(errs, fmt.Errorf("reloader container: does not watch %s (args %v)", inc, reloader.Args))
			}
		}
		if sysPassword == nil || sysPassword.ValueFrom == nil || sysPassword.ValueFrom.SecretKeyRef == nil {
			errs = append(errs, fmt.Errorf("nats container: NATS_SYS_PASSWORD, which %s reads, is not from a Secret", inc))
		}
	}
	if users == "" {
		errs = append(errs, fmt.Errorf("nats.conf includes no file of a mounted Secret (includes %v): the servers have none of toposched's users", includes))
	}
	return errors.Join(errs...)
}

// configMapFile is the text of file, mounted into c from a ConfigMap.
func configMapFile(spec *corev1.PodSpec, c *corev1.Container, objs []any, file string) (string, error) {
	vol, _ := mountOf(c, path.Dir(file))
	v := volume(spec, vol)
	if v == nil || v.ConfigMap == nil {
		return "", fmt.Errorf("container %s: %s is not from a ConfigMap", c.Name, file)
	}
	for _, o := range objs {
		if cm, ok := o.(*corev1.ConfigMap); ok && cm.Name == v.ConfigMap.Name {
			text, ok := cm.Data[path.Base(file)]
			if !ok {
				return "", fmt.Errorf("ConfigMap %s: no %s", cm.Name, path.Base(file))
			}
			return text, nil
		}
	}
	return "", fmt.Errorf("ConfigMap %s: not rendered", v.ConfigMap.Name)
}

// mountOf is the volume c mounts at dir (no subPath), and whether
// read-only.
func mountOf(c *corev1.Container, dir string) (string, bool) {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) && m.SubPath == "" {
			return m.Name, m.ReadOnly
		}
	}
	return "", false
}

func volume(spec *corev1.PodSpec, name string) *corev1.Volume {
	for i, v := range spec.Volumes {
		if v.Name == name {
			return &spec.Volumes[i]
		}
	}
	return nil
}
