"""Report a PyTorch job's step timings to toposched (runtime.telemetry).

Usage, in a training script started with the env of runtime.tuning:

    reporter = TelemetryReporter(job_id=os.environ["TOPOSCHED_JOB_ID"],
                                 nats_url=os.environ.get("NATS_URL", "nats://127.0.0.1:4222"))
    for step, batch in enumerate(loader):
        with reporter.step(step) as s:
            with s.compute():
                loss = model(batch).sum()
                loss.backward()          # for DDP, backward overlaps the all-reduce:
            with s.collective("dp", "all_reduce", nbytes=grad_bytes):
                torch.distributed.barrier()   # ... wait here for what did not overlap
            optimizer.step()

Only rank 0 publishes (every `every` steps); every rank measures, and the
slowest rank's figures are kept (an all_reduce of max over the ranks), as
the slowest rank sets the step. Needs `pip install nats-py` (asyncio).
"""

import asyncio
import contextlib
import datetime
import json
import time

import torch
import torch.distributed as dist
import nats


class _Step:
    def __init__(self):
        self.compute_s = 0.0
        self.groups = {}  # (group, collective) -> [seconds, bytes, calls]

    @contextlib.contextmanager
    def compute(self):
        torch.cuda.synchronize()
        t = time.perf_counter()
        yield
        torch.cuda.synchronize()
        self.compute_s += time.perf_counter() - t

    @contextlib.contextmanager
    def collective(self, group, collective, nbytes=0):
        torch.cuda.synchronize()
        t = time.perf_counter()
        yield
        torch.cuda.synchronize()
        g = self.groups.setdefault((group, collective), [0.0, nbytes, 0])
        g[0] += time.perf_counter() - t
        g[2] += 1


class TelemetryReporter:
    def __init__(self, job_id, nats_url, every=50, prefix="toposched"):
        self.job_id, self.every = job_id, every
        self.subject = prefix + ".runtime.telemetry"
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.loop = asyncio.new_event_loop()
        self.js = None
        if self.rank == 0:
            nc = self.loop.run_until_complete(nats.connect(nats_url))
            self.js = nc.jetstream()

    @contextlib.contextmanager
    def step(self, step):
        s = _Step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        yield s
        torch.cuda.synchronize()
        wall = time.perf_counter() - t
        if step % self.every:
            return
        # The slowest rank's figures: one small all_reduce of max.
        keys = sorted(s.groups)
        vals = torch.tensor([wall, s.compute_s] + [s.groups[k][0] for k in keys], device="cuda")
        if dist.is_initialized():
            dist.all_reduce(vals, op=dist.ReduceOp.MAX)
        if self.rank != 0:
            return
        wall, compute = vals[0].item(), min(vals[1].item(), vals[0].item())
        groups = []
        for k, secs in zip(keys, vals[2:].tolist()):
            _, nbytes, calls = s.groups[k]
            g = {"group": k[0], "collective": k[1], "seconds": max(secs, 1e-9), "calls": max(calls, 1)}
            if nbytes:
                g["bytes"] = nbytes
            groups.append(g)
        body = {
            "job_id": self.job_id, "step": step, "step_seconds": wall, "compute_seconds": compute,
            "groups": groups[:64],  # the schema's bound
            "reported_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        # A bare message is accepted: the type comes from the subject, the
        # id from the stream position. Nats-Msg-Id makes a retry idempotent.
        headers = {"Nats-Msg-Id": f"{self.job_id}-telemetry-{step}"}
        self.loop.run_until_complete(self.js.publish(self.subject, json.dumps(body).encode(), headers=headers))
