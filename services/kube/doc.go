// Package kube is toposched's Kubernetes service: the door through which
// the pods users already write run on the placement toposched decides.
//
// On Kubernetes the kubelet and its DRA drivers own the GPUs, so no
// toposched agent starts ranks there. Instead this service watches the
// pods whose spec.schedulerName is toposched's, groups them into gangs by
// the labels of the workload that made them (gang.go), and submits each
// complete gang as one job (jobs.submitted, tenant = namespace). When
// placement decides, it carries the decision out the way kube-scheduler
// carries out its own (bind.go): each pod's ResourceClaims get
// status.allocation with exactly the decided GPUs (allocated by
// k8s.io/dynamic-resource-allocation's structured allocator, offered only
// those devices, so that the claims' selectors, constraints and class
// configuration are honoured as upstream honours them), and then every pod
// of the gang is bound, with its rank environment in the Binding's
// annotations, all or nothing.
//
// The inventory comes from the cluster (inventory.go): the ResourceSlices
// that NVIDIA's DRA driver publishes are matched, by GPU UUID or PCI bus
// id, to the topology toposched knows (agent discovery or the cluster
// file). GPUs that other schedulers' claims hold, and the GPUs of nodes
// that are cordoned, not ready or tainted against toposched, are published
// as topology.held, so placement never gives them out: the API server
// accepts two claims allocated one device, so keeping them apart is the
// schedulers' job.
//
// The service keeps no state of its own. It reads the job, placement and
// topology streams from their start and then follows them (state.go),
// and reconciles the cluster against them: a decision it had not finished
// carrying out when it stopped is carried out again (every step checks
// what is done already), and a claim it allocated for a job that is gone,
// with its pod not bound, is given back.
package kube
