// Command etcd is etcd's server, built from the module version that
// k8s.io/kubernetes pins, for the e2e control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
