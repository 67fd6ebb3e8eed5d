package toposched.placement.leaf_span_test

import data.toposched.placement.leaf_span

test_small_job_one_leaf if {
	count(leaf_span.deny) == 0 with input as {"job": {"gpus": 8}, "placement": {"leaves": ["l1"]}}
}

test_small_job_two_leaves_denied if {
	denied := leaf_span.deny with input as {"job": {"gpus": 8}, "placement": {"leaves": ["l1", "l2"]}}
	some v in denied
	v.code == "leaf_span"
}

test_medium_job_two_leaves if {
	count(leaf_span.deny) == 0 with input as {"job": {"gpus": 64}, "placement": {"leaves": ["l1", "l2"]}}
}

test_large_job_unlimited if {
	count(leaf_span.deny) == 0 with input as {"job": {"gpus": 1024}, "placement": {"leaves": ["l1", "l2", "l3", "l4", "l5", "l6", "l7", "l8", "l9"]}}
}

test_limits_from_data if {
	denied := leaf_span.deny with input as {"job": {"gpus": 64}, "placement": {"leaves": ["l1", "l2"]}}
		with data.toposched.config.leaf_span.limits as [{"max_gpus": 64, "max_leaves": 1}]
	count(denied) == 1
}
