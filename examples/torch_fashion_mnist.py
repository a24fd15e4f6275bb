#!/usr/bin/python3
"""A small CNN on Fashion-MNIST, in one process or as a Harrier worker.

  --mode=single   plain PyTorch: torch.optim.SGD with (Nesterov) momentum.
  --mode=worker   one of --num_workers processes; the gradients go to the
                  Harrier server shards (--servers), which run the same
                  optimizer, so N workers with global batch B compute what
                  one process computes with batch B. With --update=average
                  the shards average the gradients instead and every worker
                  runs the optimizer on the average, as PyTorch DDP does.
                  With --update=worker every worker runs the optimizer on
                  its own batches and the shards (--sync=local
                  --local_steps=H) average the models every --local_steps
                  steps: local SGD, what DDP's post-local SGD does.

Both modes end with stdout lines (rank 0 only in worker mode):

  test_accuracy=0.XXXX
  wall_seconds=N.N
  train_seconds=N.N
  steps=N
  ms_per_step=N.N

and in worker mode update=server, update=average or update=worker (where
the optimizer ran), local_steps=H (steps between averages of the models,
1 unless --update=worker), transport=tcp, grpc or ucx (the data path the
shards got; "tcp,grpc" when they differ), bytes_pushed=N and bytes_pulled=N
(this worker's client), and with --techniques forward_order_tail=F (the
share of a step's push bytes the workers sent last, front first).

Progress lines go to stderr. The data are the IDX files of Debian's
dataset-fashion-mnist package (--data_dir).

Why the shards give the single-process maths: every epoch all workers draw
the same permutation (seeded by --seed and the epoch) and worker r takes
perm[r::N]. Batch k of worker r is then the elements (k*b + j)*N + r of the
permutation, j < b = B/N, and over all workers that is exactly
perm[k*B:(k+1)*B], batch k of the single-process run. The mean of the N
workers' mean losses is the mean loss over that batch, so the averaged
gradient is the single-process gradient. The last incomplete batch is
dropped in both modes.

The model holds parameters only (no BatchNorm, no buffers): the parameter
server holds parameters, nothing else. The learning rate is constant because
the servers' optimizer has no schedule.
"""

import time

START = time.perf_counter()  # wall_seconds counts the imports and the data loading

import argparse
import gzip
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Tuned in single mode, one thread. With a constant lr (the shards' optimizer
# has no schedule) a conv 8-16 / fc 64 net plateaus at 0.902-0.907 (seeds
# 1-3, 6 epochs) and gave 0.9022 as 4 Harrier workers: too little margin
# over 0.90. conv 16-32 / fc 128 reaches 0.909 single and 0.9096 as 4
# workers in 6 epochs, at about twice the time. Global batch 128 is
# noisier (0.9005), 512 slower (0.892), lr 0.03 slower (0.902 after 6).
DEFAULT_EPOCHS = 6
DEFAULT_BATCH_SIZE = 256
DEFAULT_LR = 0.05
DEFAULT_MOMENTUM = 0.9
DEFAULT_OPTIMIZER = "nesterov"

# Per-pixel statistics of the Fashion-MNIST training images.
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530

IDX_IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dimension

MISSING_DATA_HINT = "install dataset-fashion-mnist (./deploy/setup.sh)"


class DataError(Exception):
    pass


def read_idx(path, magic, dims):
    """Returns the IDX file's data as a uint8 array of `dims` dimensions."""
    if not os.path.exists(path):
        raise DataError(f"{path} not found: {MISSING_DATA_HINT}")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    header = 4 + 4 * dims
    if len(data) < header:
        raise DataError(f"{path}: {len(data)} bytes, shorter than the IDX header")
    (found,) = struct.unpack(">I", data[:4])
    if found != magic:
        raise DataError(f"{path}: magic 0x{found:08x}, expected 0x{magic:08x}")
    shape = struct.unpack(f">{dims}I", data[4:header])
    size = int(np.prod(shape))
    if len(data) - header != size:
        raise DataError(f"{path}: {len(data) - header} data bytes, header shape "
                        f"{shape} needs {size}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def load_split(data_dir, prefix):
    """Returns (images float32 [n,1,28,28] normalised, labels int64 [n])."""
    def path(name):
        plain = os.path.join(data_dir, name)
        return plain + ".gz" if not os.path.exists(plain) else plain
    images = read_idx(path(f"{prefix}-images-idx3-ubyte"), IDX_IMAGES_MAGIC, 3)
    labels = read_idx(path(f"{prefix}-labels-idx1-ubyte"), IDX_LABELS_MAGIC, 1)
    if images.shape[0] != labels.shape[0]:
        raise DataError(f"{data_dir} {prefix}: {images.shape[0]} images but "
                        f"{labels.shape[0]} labels")
    if images.shape[1:] != (28, 28):
        raise DataError(f"{data_dir} {prefix}: images of {images.shape[1:]}, "
                        "expected 28x28")
    if labels.size and labels.max() > 9:
        raise DataError(f"{data_dir} {prefix}: label {labels.max()} out of 0..9")
    x = (images.astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return (torch.from_numpy(x).unsqueeze(1).contiguous(),
            torch.from_numpy(labels.astype(np.int64)))


class Net(nn.Module):
    """conv 5x5 -> relu -> maxpool 2, twice; fc -> relu -> fc. No buffers."""

    def __init__(self, c1, c2, hidden):
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2)
        self.fc1 = nn.Linear(c2 * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def evaluate(model, x, y, batch=250):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / x.shape[0]


def epoch_permutation(n, seed, epoch):
    """The same on every worker: the shards of one epoch stay disjoint."""
    g = torch.Generator()
    g.manual_seed(seed * 1000003 + epoch)
    return torch.randperm(n, generator=g)


def server_args(args):
    if args.update == "worker":
        # The shards average the models the workers' own optimizer stepped.
        return f"--sync=local --local_steps={args.local_steps}"
    return f"--optimizer={args.optimizer} --lr={args.lr:g} --momentum={args.momentum:g}"


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="A CNN on Fashion-MNIST: one PyTorch process (--mode=single) "
                    "or one Harrier worker of N (--mode=worker).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--mode", choices=["single", "worker"], default="single")
    p.add_argument("--servers", default="",
                   help="worker mode: comma-separated host:port of the server shards")
    p.add_argument("--rank", type=int, default=None,
                   help="worker mode: this worker's rank, 0..num_workers-1")
    p.add_argument("--num_workers", type=int, default=1,
                   help="worker mode: number of workers; divides --batch_size")
    p.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    p.add_argument("--batch_size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="global batch size (each worker takes batch_size/num_workers)")
    p.add_argument("--lr", type=float, default=DEFAULT_LR,
                   help="learning rate (worker mode, --update=server: the servers' --lr "
                        "applies)")
    p.add_argument("--momentum", type=float, default=DEFAULT_MOMENTUM)
    p.add_argument("--optimizer", choices=["nesterov", "momentum"],
                   default=DEFAULT_OPTIMIZER,
                   help="momentum form (worker mode, --update=server: the servers' "
                        "--optimizer applies)")
    p.add_argument("--seed", type=int, default=1,
                   help="model initialisation and data order; the same on every worker")
    p.add_argument("--limit_steps", type=int, default=0,
                   help="stop after this many steps (0: run all epochs)")
    p.add_argument("--eval_every", type=int, default=0,
                   help="evaluate on the test set every N steps (0: only at the end)")
    p.add_argument("--log_every", type=int, default=100, help="progress line every N steps")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--conv1", type=int, default=16, help="channels of the first conv layer")
    p.add_argument("--conv2", type=int, default=32, help="channels of the second conv layer")
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden fc layer")
    p.add_argument("--codec", default="none",
                   help="worker mode: push compression, e.g. topk:ratio=0.01 (harrier.Client)")
    p.add_argument("--pull_codec", default="none",
                   help="worker mode: pull compression, e.g. fp16; paired: the pair of --codec "
                   "(top-k with top-k, PowerSGD with PowerSGD, ...); none: dense")
    p.add_argument("--techniques", default="none",
                   help="worker mode: comm scheduler techniques (plain, wfbp, fusion, "
                        "priority, all, a+b) or none: each gradient pushed from its hook")
    p.add_argument("--forward_order_tail", default="measure",
                   help="worker mode with --techniques: the share of a step's push bytes, the "
                        "front of the model, sent last and front first (a fraction in [0, 1]), "
                        "or measure: the workers time their second step and agree it")
    p.add_argument("--transport", choices=["auto", "tcp", "grpc", "ucx"],
                   default=os.environ.get("HARRIER_TRANSPORT", "auto"),
                   help="data plane for pushes and pulls (auto: tcp where the shards serve it "
                        "and there is no TLS, else gRPC; ucx: the shards run --ucx)")
    p.add_argument("--fusion_bytes", type=int, default=0,
                   help="worker mode, --update=average: gradient buckets of up to N bytes, "
                   "filled from the last layer back (0: 4 MiB, the whole model here; "
                   "-1: one parameter each)")
    p.add_argument("--update", choices=["server", "average", "worker"], default="server",
                   help="worker mode: server: the shards run the optimizer on the pushed "
                        "gradients; average: the shards average the gradients (one fused "
                        "bucket, --codec compressing it, --pull_codec the average pulled "
                        "back) and each worker runs this script's optimizer, as DDP does; "
                        "worker: each worker runs this script's optimizer on its own "
                        "batches and the shards average the models every --local_steps "
                        "steps (local SGD: the shards run --sync=local)")
    p.add_argument("--local_steps", type=int, default=1,
                   help="--update=worker: steps between averages of the models (the "
                        "shards' --local_steps; --print_server_args prints it)")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--print_server_args", action="store_true",
                   help="print the Harrier server flags that match these "
                        "hyperparameters (e.g. for deploy/quickstart.sh) and exit")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        p.error("--epochs and --batch_size must be positive, --lr above zero")
    if args.mode == "worker":
        if not args.servers:
            p.error("--mode=worker needs --servers=host:port[,host:port...]")
        if args.num_workers < 1:
            p.error("--num_workers must be at least 1")
        if args.rank is None or not 0 <= args.rank < args.num_workers:
            p.error(f"--mode=worker needs --rank in 0..{args.num_workers - 1}")
        if args.update != "server" and args.techniques != "none":
            p.error("--techniques schedules pushes for the shards' optimizer: "
                    "it needs --update=server")
        if args.batch_size % args.num_workers:
            p.error(f"--batch_size={args.batch_size} is not divisible by "
                    f"--num_workers={args.num_workers}")
        if args.local_steps != 1 and args.update != "worker":
            p.error("--local_steps averages the models every H steps: it needs --update=worker")
        if args.forward_order_tail != "measure":
            try:
                tail = float(args.forward_order_tail)
            except ValueError:
                tail = -1.0
            if not 0.0 <= tail <= 1.0:
                p.error(f"--forward_order_tail={args.forward_order_tail}: want a fraction in "
                        "[0, 1] or measure")
    if args.local_steps < 1:
        p.error("--local_steps must be at least 1")
    return args


def main(argv):
    start = START
    args = parse_args(argv)
    if args.print_server_args:
        print(server_args(args))
        return 0
    torch.set_num_threads(args.threads)
    worker = args.mode == "worker"
    rank = args.rank if worker else 0
    num_workers = args.num_workers if worker else 1
    tag = f"rank={rank} " if worker else ""

    try:
        train_x, train_y = load_split(args.data_dir, "train")
        test_x, test_y = load_split(args.data_dir, "t10k")
    except DataError as e:
        log(f"torch_fashion_mnist: {e}")
        return 1

    torch.manual_seed(args.seed)  # the same initial parameters on every worker
    model = Net(args.conv1, args.conv2, args.hidden)
    assert not list(model.buffers()), "the model must hold parameters only"
    local = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                            nesterov=args.optimizer == "nesterov")

    client = None
    if worker:
        try:
            import harrier
            import harrier.torch as htorch
        except ImportError as e:
            log(f"torch_fashion_mnist: --mode=worker needs Harrier's Python "
                f"package (harrier, harrier.torch) on the path: {e}")
            return 1
        average = args.update == "average"
        # update=average: the codecs belong to the optimizer's averaged bucket.
        client = harrier.Client(servers=args.servers.split(","), rank=args.rank,
                                codec="none" if average else args.codec,
                                pull_codec="none" if average else args.pull_codec,
                                transport=args.transport)
        if client.rank != args.rank or client.num_workers != args.num_workers:
            log(f"torch_fashion_mnist: the client says rank={client.rank} "
                f"num_workers={client.num_workers}, the flags say rank={args.rank} "
                f"num_workers={args.num_workers}")
            client.leave()
            return 1
        if average:
            # The local optimizer steps on the averaged gradients; every
            # worker starts from rank 0's parameters.
            htorch.broadcast_parameters(model.state_dict(), root_rank=0, client=client)
            opt = htorch.DistributedOptimizer(
                local, model.named_parameters(), client=client, update="average",
                compression=args.codec, fusion_bytes=args.fusion_bytes,
                pull_compression=args.pull_codec)
        elif args.update == "worker":
            # Local SGD: this worker's optimizer steps on its own batches;
            # every H steps the shards average the models. The shards' H
            # decides; the flag must say the same.
            shard_steps = int(client.sync["local_steps"])
            if client.sync["mode"] != "local" or shard_steps != args.local_steps:
                log(f"torch_fashion_mnist: --update=worker --local_steps={args.local_steps} "
                    f"needs shards started with {server_args(args)}; they run "
                    f"--sync={client.sync['mode']} --local_steps={shard_steps}")
                client.leave()
                return 1
            opt = htorch.DistributedOptimizer(local, model.named_parameters(), client=client,
                                              update="worker", sync="local")
        else:
            # The shards run the optimizer; the local one's lr and momentum are unused.
            opt = htorch.DistributedOptimizer(
                local, model.named_parameters(), client=client, model=model,
                techniques=None if args.techniques == "none" else args.techniques,
                forward_order_tail=(args.forward_order_tail if args.forward_order_tail == "measure"
                                    else float(args.forward_order_tail)))
            log(f"{tag}the servers must run with {server_args(args)} to match these "
                "hyperparameters (the local optimizer's lr is unused)")
    else:
        opt = local

    batch = args.batch_size // num_workers
    steps_per_epoch = train_x.shape[0] // args.batch_size
    total_steps = steps_per_epoch * args.epochs
    if args.limit_steps:
        total_steps = min(total_steps, args.limit_steps)
    log(f"{tag}mode={args.mode} epochs={args.epochs} global_batch={args.batch_size} "
        f"worker_batch={batch} lr={args.lr:g} momentum={args.momentum:g} "
        f"optimizer={args.optimizer} threads={args.threads} "
        f"model=conv{args.conv1}-conv{args.conv2}-fc{args.hidden} "
        f"params={sum(p.numel() for p in model.parameters())} steps={total_steps}")

    train_start = time.perf_counter()
    eval_seconds = 0.0  # mid-training evaluations, not counted in train_seconds
    step = 0
    loss_sum, loss_count = 0.0, 0
    while step < total_steps:
        epoch = step // steps_per_epoch
        perm = epoch_permutation(train_x.shape[0], args.seed, epoch)
        shard = perm[rank::num_workers]
        for k in range(steps_per_epoch):
            if step >= total_steps:
                break
            idx = shard[k * batch:(k + 1) * batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            loss.backward()
            opt.step()
            step += 1
            loss_sum += loss.item()
            loss_count += 1
            if step % args.log_every == 0 or step == total_steps:
                log(f"{tag}epoch={epoch} step={step} loss={loss_sum / loss_count:.4f} "
                    f"elapsed={time.perf_counter() - start:.1f}")
                loss_sum, loss_count = 0.0, 0
            if args.eval_every and step % args.eval_every == 0 and rank == 0 \
                    and step != total_steps:
                eval_start = time.perf_counter()
                accuracy = evaluate(model, test_x, test_y)
                eval_seconds += time.perf_counter() - eval_start
                log(f"{tag}eval step={step} test_accuracy={accuracy:.4f} "
                    f"elapsed={time.perf_counter() - start:.1f} train_seconds="
                    f"{time.perf_counter() - train_start - eval_seconds:.2f}")
    if worker:
        opt.finish()
        client.barrier("done")
        opt.refresh()  # the parameters after every worker's last push
    train_seconds = time.perf_counter() - train_start - eval_seconds

    lines = []
    if rank == 0:
        accuracy = evaluate(model, test_x, test_y)
        if args.eval_every:
            log(f"{tag}eval step={step} test_accuracy={accuracy:.4f} "
                f"elapsed={time.perf_counter() - start:.1f} train_seconds={train_seconds:.2f}")
        lines.append(f"test_accuracy={accuracy:.4f}")
    lines += [f"wall_seconds={time.perf_counter() - start:.1f}",
              f"train_seconds={train_seconds:.1f}",
              f"steps={step}",
              f"ms_per_step={1000 * train_seconds / max(step, 1):.1f}"]
    if worker:
        stats = client.stats()
        lines += [f"update={args.update}", f"local_steps={args.local_steps}",
                  f"transport={','.join(sorted(set(client.data_paths)))}",
                  f"bytes_pushed={stats['bytes_pushed']}",
                  f"bytes_pulled={stats['bytes_pulled']}"]
        scheduler = opt.stats().get("scheduler") if opt is not local else None
        if scheduler is not None:
            lines.append(f"forward_order_tail={scheduler['forward_order_tail']:.4f}")
        client.leave()
    out = sys.stdout if rank == 0 else sys.stderr
    for line in lines:
        print(f"{tag}{line}" if out is sys.stderr else line, file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
