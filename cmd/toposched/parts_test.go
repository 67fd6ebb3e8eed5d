package main

import (
	"github.com/toposched/toposched/services/analysis"
	"github.com/toposched/toposched/services/discovery"
	"github.com/toposched/toposched/services/kube"
	"github.com/toposched/toposched/services/launcher"
	"github.com/toposched/toposched/services/operator"
	"github.com/toposched/toposched/services/optimizer"
	"github.com/toposched/toposched/services/placement"
	"github.com/toposched/toposched/services/slurm"
)

// Every long-running part the commands run has the one shape: built by
// New from a Config and Deps, run by Run until its context ends, waited
// for on Ready. A part that drifts from it stops this file compiling.
var _ = []operator.Part{
	(*discovery.Service)(nil), (*analysis.Service)(nil), (*placement.Service)(nil), (*optimizer.Service)(nil),
	(*kube.Service)(nil), (*slurm.Service)(nil),
	(*launcher.Agent)(nil), (*launcher.Watchdog)(nil),
	(*operator.Operator)(nil),
}
