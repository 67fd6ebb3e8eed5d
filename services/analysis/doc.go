// Package analysis turns a submitted job into its communication pattern:
// the resolved parallel degrees, the rank layout and, for every parallel
// dimension, the groups of ranks that communicate. It validates what the
// schema cannot (the arithmetic between gpus and the degrees) and answers an
// invalid job with placement.rejected naming the field and the rule.
//
// Rank layout follows Megatron-LM: the fastest-varying dimension first,
// tp → cp → ep → dp → pp, with expert parallelism carved out of the data
// parallel ranks (ep divides dp). A global rank r has coordinates
//
//	tp_i = r mod tp, cp_i = (r / tp) mod cp, dp_i = (r / (tp·cp)) mod dp,
//	ep_i = dp_i mod ep, pp_i = r / (tp·cp·dp)
//
// and a group of dimension d is the set of ranks that differ only in d.
package analysis
