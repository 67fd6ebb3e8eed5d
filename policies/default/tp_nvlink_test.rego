package toposched.placement.tp_nvlink_test

import data.toposched.placement.tp_nvlink

test_one_island_allowed if {
	denied := tp_nvlink.deny with input as {"placement": {"tp_groups": [{"nvlink_domains": ["n1/nvl0"]}, {"nvlink_domains": ["n1/nvl1"]}]}}
	count(denied) == 0
}

test_two_islands_denied if {
	denied := tp_nvlink.deny with input as {"placement": {"tp_groups": [{"nvlink_domains": ["n1/nvl0", "n2/nvl0"]}]}}
	some v in denied
	v.code == "tp_outside_nvlink"
}

test_no_tp_groups_allowed if {
	denied := tp_nvlink.deny with input as {"placement": {"tp_groups": []}}
	count(denied) == 0
}
