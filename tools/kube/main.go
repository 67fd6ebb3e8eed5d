// Command kubetools pins the Kubernetes control plane the e2e tests run
// (kube-apiserver and kube-controller-manager from k8s.io/kubernetes, and
// etcd in ./etcd), and kube-scheduler, which the benchmarks run as the
// baseline toposched is compared with; build.sh builds them into a cache
// directory. It is a module of its own so none of this takes part in the
// product's version selection.
package main

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {}
