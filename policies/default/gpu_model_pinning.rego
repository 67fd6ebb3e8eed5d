# GPU model pinning.
#
# A job pins a GPU model with its gpu_model field or, failing that, with the
# label toposched.io/gpu-model; nodes of any other model are denied. A job
# that pins nothing runs anywhere.
package toposched.nodes.gpu_model_pinning

wanted := input.job.gpu_model if input.job.gpu_model != ""

wanted := input.job.labels["toposched.io/gpu-model"] if input.job.gpu_model == ""

deny contains v if {
	input.node.gpu_model != wanted
	v := {
		"code": "gpu_model_mismatch",
		"msg": sprintf("node %s has %s GPUs, the job wants %s", [input.node.name, input.node.gpu_model, wanted]),
	}
}
