"""Time a PyTorch job's steps and collectives and report them to toposched.

Standard library only: no NATS client. A rank started by the node agent
(`toposched agent --exec`) finds the agent's local endpoint in
TOPOSCHED_TELEMETRY_URL, its job in TOPOSCHED_JOB_ID and the job's token in
TOPOSCHED_TELEMETRY_TOKEN (sent as Authorization: Bearer, without which the
agent refuses a report); the agent checks each report against the
runtime.telemetry schema and publishes it.

    import toposched_telemetry

    reporter = toposched_telemetry.Reporter(every=50)
    for step, batch in enumerate(loader):
        with reporter.step(step) as s:
            with s.compute():
                loss = model(batch).sum()
                loss.backward()          # with DDP, backward overlaps the all-reduce:
            with s.collective("dp", "all_reduce", nbytes=grad_bytes):
                torch.distributed.barrier()   # ... time what did not overlap
            optimizer.step()

Every rank measures; every `every` steps the slowest rank's figures are
taken (one small all_reduce of max, as the slowest rank sets the step) and
rank 0 sends them. CUDA work is synchronised around each timed block when
torch uses CUDA, which serialises what DDP overlaps: report every 50 steps
or so. A report that cannot be sent is logged once and never stops training.
"""

import contextlib
import datetime
import json
import os
import sys
import time
import urllib.error
import urllib.request


def _torch():
    """torch, if the training script imported it (this module never does)."""
    return sys.modules.get("torch")


def _sync():
    torch = _torch()
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Step:
    """One step's timings: compute and, per (group, collective), seconds."""

    def __init__(self):
        self.compute_s = 0.0
        self.groups = {}  # (group, collective) -> [seconds, bytes, calls]

    @contextlib.contextmanager
    def compute(self):
        _sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            _sync()
            self.compute_s += time.perf_counter() - t

    @contextlib.contextmanager
    def collective(self, group, collective, nbytes=0):
        """Time a torch.distributed call (or several) of one group kind."""
        _sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            _sync()
            g = self.groups.setdefault((group, collective), [0.0, nbytes, 0])
            g[0] += time.perf_counter() - t
            g[2] += 1


class Reporter:
    def __init__(self, every=50, url=None, job_id=None, token=None, timeout=2.0):
        self.every = max(1, int(every))
        self.url = url or os.environ.get("TOPOSCHED_TELEMETRY_URL", "")
        self.job_id = job_id or os.environ.get("TOPOSCHED_JOB_ID", "")
        # The agent takes the job's reports only with its token.
        self.token = token or os.environ.get("TOPOSCHED_TELEMETRY_TOKEN", "")
        self.timeout = timeout
        self.sent = 0
        self._warned = False
        if not self.url or not self.job_id:
            self._warn("no TOPOSCHED_TELEMETRY_URL or TOPOSCHED_JOB_ID: not started by toposched agent --exec; nothing is reported")

    def _warn(self, msg):
        if not self._warned:
            print("toposched_telemetry: " + msg, file=sys.stderr, flush=True)
            self._warned = True

    @staticmethod
    def _rank():
        torch = _torch()
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        return int(os.environ.get("RANK", "0"))

    @contextlib.contextmanager
    def step(self, step):
        s = Step()
        _sync()
        t = time.perf_counter()
        yield s
        _sync()
        wall = time.perf_counter() - t
        if step % self.every:
            return
        keys = sorted(s.groups)
        vals = [wall, s.compute_s] + [s.groups[k][0] for k in keys]
        torch = _torch()
        if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
            dist = torch.distributed
            device = "cuda" if dist.get_backend() == "nccl" else "cpu"
            tv = torch.tensor(vals, dtype=torch.float64, device=device)
            dist.all_reduce(tv, op=dist.ReduceOp.MAX)
            vals = tv.tolist()
        if self._rank() != 0 or not self.url or not self.job_id:
            return
        wall, compute = vals[0], min(vals[1], vals[0])
        groups = []
        for k, secs in zip(keys, vals[2:]):
            _, nbytes, calls = s.groups[k]
            g = {"group": k[0], "collective": k[1], "seconds": max(secs, 1e-9), "calls": max(calls, 1)}
            if nbytes:
                g["bytes"] = nbytes
            groups.append(g)
        self.send({
            "job_id": self.job_id, "step": step,
            "step_seconds": max(wall, 1e-9), "compute_seconds": compute,
            "groups": groups[:64],  # the schema's bound
            "reported_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        })

    def send(self, body):
        """POST one runtime.telemetry body; True once the agent took it."""
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": "Bearer " + self.token})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
            self.sent += 1
            return True
        except urllib.error.HTTPError as e:
            self._warn("report refused (%d): %s" % (e.code, e.read().decode(errors="replace").strip()))
        except (urllib.error.URLError, OSError) as e:
            self._warn("report not sent: %s" % e)
        return False
