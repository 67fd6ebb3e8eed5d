package toposched.placement.keep_whole_nodes_test

import data.toposched.placement.keep_whole_nodes

scarce := {"whole_free_nodes_by_model": {"H100": 1}}

plenty := {"whole_free_nodes_by_model": {"H100": 10}}

whole := {"name": "n1", "gpu_model": "H100", "gpus": 2, "gpus_total": 8, "gpus_free": 8}

partial := {"name": "n2", "gpu_model": "H100", "gpus": 2, "gpus_total": 8, "gpus_free": 4}

test_small_job_on_whole_node_penalised if {
	keep_whole_nodes.score == 1 with input as {"job": {"gpus": 2}, "placement": {"nodes": [whole]}, "cluster": scarce}
	count(keep_whole_nodes.warn) == 1 with input as {"job": {"gpus": 2}, "placement": {"nodes": [whole]}, "cluster": scarce}
}

test_partial_node_free if {
	keep_whole_nodes.score == 0 with input as {"job": {"gpus": 2}, "placement": {"nodes": [partial]}, "cluster": scarce}
}

test_not_scarce_free if {
	keep_whole_nodes.score == 0 with input as {"job": {"gpus": 2}, "placement": {"nodes": [whole]}, "cluster": plenty}
}

test_large_job_free if {
	keep_whole_nodes.score == 0 with input as {"job": {"gpus": 16}, "placement": {"nodes": [whole]}, "cluster": scarce}
}

test_penalty_from_data if {
	keep_whole_nodes.score == 5 with input as {"job": {"gpus": 2}, "placement": {"nodes": [whole]}, "cluster": scarce}
		with data.toposched.config.keep_whole_nodes.penalty as 5
}
