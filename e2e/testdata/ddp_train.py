"""A DDP job for the launch e2e test: gloo on CPU, the environment the node
agent set (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), one checked
all-reduce, a few training steps, telemetry through toposched_telemetry."""

import os
import sys

import torch
import torch.distributed as dist

import toposched_telemetry

dist.init_process_group("gloo")  # env:// from the agent's variables
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"]), "rank or world size"

t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
want = world * (world + 1) / 2
assert t.item() == want, "all_reduce gave %s, want %s" % (t.item(), want)
print("all_reduce ok: %g" % t.item(), flush=True)

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
reporter = toposched_telemetry.Reporter(every=1)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
for step in range(steps):
    with reporter.step(step) as s:
        x, y = torch.randn(8, 16), torch.randn(8, 1)
        with s.compute():
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        with s.collective("dp", "all_reduce", nbytes=17 * 4):
            dist.barrier()
        opt.step()
        opt.zero_grad()
    print("step %d loss %.4f" % (step, loss.item()), flush=True)
print("telemetry reports sent: %d" % reporter.sent, flush=True)
# Torn down in step. In one of four CI runs on 2026-12-06 rank 1 aborted
# after its last step ("terminate called without an active exception",
# torch 1.13 with gloo): the DDP reducer still held the process group when
# it was destroyed, and rank 0, which hosts the rendezvous store, may have
# gone already. So the reducer goes first, and every rank waits for the
# others before any destroys the group.
del model, opt
dist.barrier()
dist.destroy_process_group()
