// Package gpuspeed holds what one GPU model computes against another: a
// table of the models toposched knows (bf16 dense tensor TFLOPS and memory
// bandwidth, from the vendors' specifications, each entry with its
// sources) and the rule that turns a step's compute time measured on one
// model into its time on another.
//
// # The rule
//
// A training step is neither purely matrix-multiply bound (peak tensor
// TFLOPS) nor purely memory bound (normalisation, activations, the
// optimizer's update): a model's speed is taken as the geometric mean of
// the two, sqrt(TFLOPS × GB/s), and a step's compute time scales with
// the inverse of it:
//
//	t_M = t_R × Speed(R) / Speed(M)
//
// (Factor). So an H100 SXM computes a step in 0.44 of an A100 SXM's
// time, a T4 in 5.5 times it. Both figures are the vendors' peaks: the
// rule assumes a model reaches the same share of its peak on every GPU,
// which a job's own measurements (JobCompute) replace where it gives them.
// No measured training throughput per model is entered: the published
// comparisons (vendor and third-party benchmark pages) measure a handful
// of networks each, on different software, and none covers the table.
//
// Pre-Ampere GPUs (T4, V100, Turing Quadro and GeForce) have no bf16:
// their entry is the fp16 tensor figure with fp32 accumulation, what
// mixed-precision training runs on them. GeForce cards are taken at their
// fp32-accumulate rate (half their fp16-accumulate peak). Dense figures
// only: the spec sheets' "with sparsity" figures are twice them.
//
// # A job's own compute times
//
// A job may give its step compute time per GPU model
// (step_compute_seconds_by_model); JobCompute says which time a job has on
// a model: its own time for that model when it gives one; else scaled by
// the rule from its own time for the model of the closest speed; else its
// step_compute_seconds (or the placer's estimate from its model's size)
// taken as measured on the reference model, scaled by the rule. A model
// the table does not know is charged no scaling (ok false), as before
// this table.
package gpuspeed
