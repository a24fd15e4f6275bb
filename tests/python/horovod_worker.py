"""One worker of horovod_test.py, written against harrier.torch's Horovod
surface: it joins the job from the environment (HARRIER_SERVERS,
HARRIER_RANK, ...) with init() and writes what it saw to --out (.npz)."""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import harrier
import harrier.torch as hvd
import torch_worker


def momentum(args):
    """N steps of the user's own SGD with momentum and a step schedule, on
    this rank's half of each batch; every rank starts from its own seed, so
    only the broadcasts make them start alike."""
    _, inputs, labels = torch_worker.model_and_data(0, args.steps, args.batch)
    torch.manual_seed(100 + hvd.rank())
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    # Rank 0's lr and momentum win through broadcast_optimizer_state.
    lr = args.lr if hvd.rank() == 0 else 7.0
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=args.passes)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    part = args.batch // hvd.size()
    micro = part // args.passes
    for step in range(args.steps):
        # --zero_grad=alternate: gradients set to None (autograd allocates
        # them afresh) on even steps, zeroed where they are on odd ones.
        optimizer.zero_grad(set_to_none=args.zero_grad == "alternate" and step % 2 == 0)
        for p in range(args.passes):
            mine = slice(hvd.rank() * part + p * micro, hvd.rank() * part + (p + 1) * micro)
            loss = F.cross_entropy(model(inputs[step][mine]), labels[step][mine])
            (loss / args.passes).backward()
        optimizer.step()
        schedule.step()
    params = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    # Where the averaged gradients were handed back: in the buckets' memory.
    buckets = [(b.data_ptr(), b.data_ptr() + 4 * b.numel())
               for b in optimizer._bucket_grads + optimizer._bucket_pulled]
    in_buckets = all(any(lo <= p.grad.data_ptr() < hi for lo, hi in buckets)
                     for p in model.parameters())
    np.savez(args.out, params=params, lr=optimizer.param_groups[0]["lr"],
             update=optimizer.update, grads_in_buckets=in_buckets)


def metric(args):
    """Trains under the shards' optimizer (whatever their --sync) for
    --steps steps, then averages metrics registered only now."""
    model, inputs, labels = torch_worker.model_and_data(0, args.steps, args.batch)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters(),
                                         update="server")
    for step in range(args.steps):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs[step]), labels[step]).backward()
        optimizer.step()
        if hvd.rank() == 1 and step % 10 == 0:
            time.sleep(0.01)  # ranks at different paces under SSP and ASP
    r = hvd.rank()
    out = {}
    # After --steps training clocks, three rounds of a new name, then others.
    for epoch in range(3):
        value = torch.tensor([r + 1.0 + epoch, 10.0 * (r + 1)])
        out[f"metric{epoch}"] = hvd.allreduce(value, name="metric").numpy()
    out["sum"] = hvd.allreduce(torch.tensor([r + 1.0]), name="count", op=hvd.Sum).numpy()
    counts = torch.tensor([3 * r, 5], dtype=torch.int64)
    out["unnamed"] = hvd.allreduce(counts).numpy()
    out["int_dtype"] = str(hvd.allreduce(counts).dtype)
    inplace = torch.full((4,), float(r))
    hvd.allreduce_(inplace, name="inplace")
    out["inplace"] = inplace.numpy()
    handle = hvd.allreduce_async(torch.tensor([2.0 * r]), name="async")
    out["async"] = hvd.synchronize(handle).numpy()
    out["push_pull"] = hvd.push_pull(torch.tensor([4.0 * r]), name="bps").numpy()
    # A compressed allreduce comes back with the codec's pair, or dense when
    # asked: 64 KiB (above compress_min_bytes), three calls each.
    big = torch.full((16384,), r + 1.0)
    for pull in ("paired", hvd.Compression.none):
        before = optimizer.client.stats()["bytes_pulled"]
        for _ in range(3):
            result = hvd.allreduce(big, name=f"big-{pull}", compression=hvd.Compression.fp16,
                                   pull_compression=pull)
        out[f"pulled_{pull}"] = optimizer.client.stats()["bytes_pulled"] - before
        out[f"big_{pull}"] = result.numpy()
    out["object"] = json.dumps(hvd.broadcast_object({"epoch": 7, "rank": r, "text": "é" * 301},
                                                    root_rank=1))
    out["broadcast"] = hvd.broadcast(torch.arange(5.0) + 10 * r, root_rank=1).numpy()
    out["size"] = hvd.size()
    out["local"] = (hvd.local_rank(), hvd.local_size())
    np.savez(args.out, **out)


def compressed(args):
    """--steps of the user's SGD with gradients averaged through a codec:
    the loss falls, and what was pushed, and pulled back with the codec's
    pair (or dense with --pull_compression=none), shrinks by the codec's
    ratio."""
    model, inputs, labels = torch_worker.model_and_data(0, args.steps, args.batch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    codec = {"fp16": hvd.Compression.fp16, "topk": hvd.Compression.topk(0.05),
             "powersgd": hvd.Compression.powersgd(2), "none": hvd.Compression.none}[args.codec]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr,
                                                         momentum=0.9),
                                         named_parameters=model.named_parameters(),
                                         compression=codec,
                                         pull_compression=args.pull_compression)
    losses = []
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs[step]), labels[step])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    np.savez(args.out, losses=np.array(losses),
             bytes_pushed=optimizer.client.stats()["bytes_pushed"],
             bytes_pulled=optimizer.client.stats()["bytes_pulled"],
             pushes=optimizer.client.stats()["pushes"],
             elements=sum(p.numel() for p in model.parameters()))


def join(args):
    """Uneven data: rank 0 has 3 batches, rank 1 has 5; rank 0 joins, and
    rank 1's last 2 steps average over itself alone. Gradient clipping the
    Horovod way (synchronize, clip, step inside skip_synchronize)."""
    r = hvd.rank()
    model = torch.nn.Linear(2, 1, bias=False).double()  # any floating dtype
    torch.nn.init.zeros_(model.weight)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                         named_parameters=model.named_parameters())
    norms = []
    for step in range(3 if r == 0 else 5):
        optimizer.zero_grad()
        (model(torch.ones(1, 2, dtype=torch.float64)) * (r + 1)).sum().backward()
        optimizer.synchronize()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)))
        with optimizer.skip_synchronize():
            optimizer.step()
    joined = hvd.join()
    np.savez(args.out, weight=model.weight.detach().numpy(), norms=np.array(norms),
             joined=joined)


def never(args):
    """Rank 0 averages a name rank 1 never pushes: a clear error in time."""
    if hvd.rank() == 0:
        start = time.monotonic()
        try:
            hvd.allreduce(torch.ones(3), name="lonely")
            message = "no error"
        except harrier.DeadlineExceededError as e:
            message = str(e)
        np.savez(args.out, message=message, seconds=time.monotonic() - start)
    else:
        # Stays in the job until rank 0's allreduce has failed: a barrier
        # here would run out of the same short rpc_timeout first on a
        # loaded machine (rank 0 needs about that long to fail).
        rank0_out = os.path.join(os.path.dirname(args.out), "worker0.npz")
        deadline = time.monotonic() + 60
        while not os.path.exists(rank0_out) and time.monotonic() < deadline:
            time.sleep(0.05)
    hvd.barrier("end")
    if hvd.rank() != 0:
        np.savez(args.out, message="", seconds=0.0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--rpc_timeout", type=float, default=60.0)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--pull_compression", default="paired")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--zero_grad", default="in_place", choices=("in_place", "alternate"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init(rpc_timeout=args.rpc_timeout)
    {"momentum": momentum, "metric": metric, "never": never, "join": join,
     "compressed": compressed}[args.scenario](args)


if __name__ == "__main__":
    main()
