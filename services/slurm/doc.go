// Package slurm is toposched's Slurm sync service: it keeps toposched's
// view of the GPUs in step with slurmctld's, which owns them on a Slurm
// cluster.
//
// Slurm places jobs toposched never saw, and runs toposched's own
// decisions (topoctl run --slurm) as Slurm jobs. The service polls
// `squeue --json` (gres_detail gives each node's GRES indices) and:
//
//   - publishes topology.held.<node> with the GPUs Slurm gave to jobs that
//     are not toposched's (a job is toposched's when its comment is
//     toposched-job=<job id>), so placement never gives them out, and an
//     empty list once they are free again;
//   - publishes jobs.finished, once, for a toposched job whose Slurm job
//     ended, with the status Slurm gives, so placement frees its GPUs;
//   - reports, at WARN and in a metric, a toposched job that Slurm runs on
//     other nodes or GPUs than placement decided: it is not killed, and the
//     GPUs it holds outside its decision are published held.
//
// A placeholder (comment toposched-job=<job id> (placeholder)), the held
// Slurm job topoctl run --slurm keeps in the queue while toposched has the
// job pending, is not the job's run: its end finishes nothing, and if
// someone releases it in Slurm, the GPUs it then holds are held like a
// foreign job's.
//
// toposched's node names are Slurm's NodeName, and a GPU's index is its
// GRES index (the order of the node's gres.conf lines, as toposched
// slurm-conf writes them). What the service knows of toposched's jobs is
// rebuilt from the jobs and placement streams at start, then followed.
package slurm
