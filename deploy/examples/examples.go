// Package examples ships the sample cluster and jobs that `toposched demo`
// runs and the README uses.
package examples

import "embed"

// FS holds cluster.yaml and jobs/*.yaml.
//
//go:embed cluster.yaml jobs/*.yaml
var FS embed.FS

// DemoJobs is the order the demo submits the sample jobs in.
var DemoJobs = []string{
	"jobs/notebook-4.yaml",
	"jobs/bert-ddp8.yaml",
	"jobs/llm-tp8-dp2.yaml",
	"jobs/finetune-l40s.yaml",
	"jobs/moe-ep4.yaml",
	"jobs/too-big.yaml",
	"jobs/bad-parallelism.yaml",
}
