package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/toposched/toposched/events"
)

// placeholderPoll is how often topoctl run --slurm asks Slurm whether the
// placeholder of a pending job is still there: the bound on how late a
// scancel of it is seen.
const placeholderPoll = time.Second

// placeholderSuffix ends a placeholder's comment after the toposched link
// (services/slurm.PlaceholderSuffix, which the sync service reads, so that
// the placeholder's end never finishes the job: TestPlaceholderComment
// checks the two agree).
const placeholderSuffix = " (placeholder)"

// slurmPlaceholder is a held Slurm job standing in Slurm's queue for a
// toposched job while toposched has it pending: squeue shows it
// PENDING (held) with the toposched link, and a scancel of it cancels the
// job. It never runs: when the job is decided it is cancelled and the job
// runs as its own srun.
type slurmPlaceholder struct {
	id int
}

// placeholderArgs are sbatch's arguments for the placeholder of job: held,
// named and commented like the job's own Slurm job, asking for the job's
// tasks and GPUs (per node where the job fixes the GPUs per node), its
// output nowhere.
func placeholderArgs(job *events.JobSubmitted) []string {
	args := []string{"--parsable", "--hold", "--job-name=" + job.JobID,
		"--comment=toposched-job=" + job.JobID + placeholderSuffix, "--output=/dev/null"}
	if p := job.GPUsPerNode; p > 0 && job.GPUs%p == 0 {
		args = append(args, "--nodes="+strconv.Itoa(job.GPUs/p), "--ntasks-per-node="+strconv.Itoa(p), "--gres=gpu:"+strconv.Itoa(p))
	} else {
		args = append(args, "--ntasks="+strconv.Itoa(job.GPUs), "--gpus="+strconv.Itoa(job.GPUs))
	}
	return append(args, "--wrap=true")
}

// submitPlaceholder puts the placeholder of job in Slurm's queue.
func submitPlaceholder(ctx context.Context, job *events.JobSubmitted) (*slurmPlaceholder, error) {
	out, err := slurmClient(ctx, "sbatch", placeholderArgs(job)...)
	if err != nil {
		return nil, err
	}
	// --parsable prints "id" or, on a federation, "id;cluster".
	idText, _, _ := strings.Cut(strings.TrimSpace(out), ";")
	id, err := strconv.Atoi(idText)
	if err != nil {
		return nil, fmt.Errorf("sbatch --parsable printed %q, not a job id", strings.TrimSpace(out))
	}
	return &slurmPlaceholder{id: id}, nil
}

// state is the placeholder's Slurm state (PENDING while held), or "" once
// Slurm has forgotten it (MinJobAge after its end).
func (p *slurmPlaceholder) state(ctx context.Context) (string, error) {
	out, err := slurmClient(ctx, "squeue", "--noheader", "--jobs="+strconv.Itoa(p.id), "--states=all", "--format=%T")
	if err != nil {
		if strings.Contains(err.Error(), "Invalid job id") {
			return "", nil
		}
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// cancel removes the placeholder from Slurm's queue.
func (p *slurmPlaceholder) cancel(ctx context.Context) error {
	_, err := slurmClient(ctx, "scancel", strconv.Itoa(p.id))
	return err
}

// slurmClient runs one Slurm client call, bounded by slurmCallTimeout,
// and returns its standard output; an error carries its standard error.
func slurmClient(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, slurmCallTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(errb.String())
		if errors.Is(err, exec.ErrNotFound) {
			msg = "Slurm's clients are not on PATH"
		}
		return string(out), fmt.Errorf("%s: %w: %s", name, err, msg)
	}
	return string(out), nil
}
