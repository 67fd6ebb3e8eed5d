package toposched.nodes.gpu_model_pinning_test

import data.toposched.nodes.gpu_model_pinning

node := {"name": "n1", "gpu_model": "H100", "labels": {}}

test_same_model_allowed if {
	denied := gpu_model_pinning.deny with input as {"job": {"gpu_model": "H100", "labels": {}}, "node": node}
	count(denied) == 0
}

test_other_model_denied if {
	denied := gpu_model_pinning.deny with input as {"job": {"gpu_model": "A100", "labels": {}}, "node": node}
	some v in denied
	v.code == "gpu_model_mismatch"
}

test_label_pins_model if {
	denied := gpu_model_pinning.deny with input as {"job": {"gpu_model": "", "labels": {"toposched.io/gpu-model": "A100"}}, "node": node}
	count(denied) == 1
}

test_unpinned_runs_anywhere if {
	denied := gpu_model_pinning.deny with input as {"job": {"gpu_model": "", "labels": {}}, "node": node}
	count(denied) == 0
}
