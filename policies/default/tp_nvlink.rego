# TP groups stay inside one NVLink domain.
#
# Tensor-parallel ranks exchange activations several times per layer; over
# anything slower than NVLink that traffic dominates the step. A candidate
# whose TP group spans more than one NVLink island is denied.
package toposched.placement.tp_nvlink

deny contains v if {
	some i, group in input.placement.tp_groups
	islands := {d | some d in group.nvlink_domains}
	count(islands) > 1
	v := {
		"code": "tp_outside_nvlink",
		"msg": sprintf("TP group %d spans %d NVLink domains (%s)", [i, count(islands), concat(", ", sort(islands))]),
	}
}
