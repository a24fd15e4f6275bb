#!/usr/bin/python3
"""examples/torch_fashion_mnist.py's model, data order, global batch and
optimizer under PyTorch DistributedDataParallel over gloo: what a PyTorch
user runs instead of Harrier. One process per rank with MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE set, as torchrun sets them
(bench/scripts/torch_vs_ddp.sh starts them in network namespaces).

--hook picks DDP's communication hook: none (fp32 all-reduce), fp16
(default_hooks.fp16_compress_hook), powersgd (PowerSGD of
--powersgd_rank, after --powersgd_start plain all-reduce steps, as its
documentation recommends) or localsgd (post-local SGD from the first step:
post_localSGD_hook without gradient all-reduce and PostLocalSGDOptimizer
averaging the models every --local_steps steps with PeriodicModelAverager,
after steps H, 2H, ... as the example's --update=worker does).

Rank 0 prints what the example prints: `eval step=N test_accuracy=X
train_seconds=T` on stderr every --eval_every steps, then test_accuracy=,
train_seconds=, steps= and ms_per_step= on stdout."""

import importlib.util
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import (default_hooks, post_localSGD_hook,
                                                         powerSGD_hook)
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.algorithms.model_averaging import utils as model_averaging_utils
from torch.distributed.optim import PostLocalSGDOptimizer

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "torch_fashion_mnist.py")


def load_example():
    spec = importlib.util.spec_from_file_location("torch_fashion_mnist", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # definitions only: its main is guarded
    return module


def main():
    example = load_example()
    # The example's flags (epochs, batch_size, lr, seed, eval_every, ...) and
    # the hook's.
    argv, hook, rank_, start_iter = [], "none", 2, 10
    for arg in sys.argv[1:]:
        if arg.startswith("--hook="):
            hook = arg.split("=", 1)[1]
        elif arg.startswith("--powersgd_rank="):
            rank_ = int(arg.split("=", 1)[1])
        elif arg.startswith("--powersgd_start="):
            start_iter = int(arg.split("=", 1)[1])
        elif arg in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            argv.append(arg)
    if hook not in ("none", "fp16", "powersgd", "localsgd"):
        print(f"ddp_torch_cnn: --hook={hook}: none, fp16, powersgd or localsgd", file=sys.stderr)
        return 2
    args = example.parse_args(argv)
    if args.local_steps != 1 and hook != "localsgd":
        print("ddp_torch_cnn: --local_steps needs --hook=localsgd", file=sys.stderr)
        return 2
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.batch_size % size:
        print(f"ddp_torch_cnn: --batch_size={args.batch_size} is not divisible by {size}",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    train_x, train_y = example.load_split(args.data_dir, "train")
    test_x, test_y = example.load_split(args.data_dir, "t10k")
    torch.manual_seed(args.seed)
    model = torch.nn.parallel.DistributedDataParallel(
        example.Net(args.conv1, args.conv2, args.hidden))  # broadcasts rank 0's
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank_,
                                            start_powerSGD_iter=start_iter)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook == "localsgd":
        # Local SGD from the first step: no gradient all-reduce at all.
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=None, subgroup=None, start_localSGD_iter=0,
            post_local_gradient_allreduce=False)
        model.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
    # The example's single-process optimizer on the averaged gradients: the
    # same maths as its shards' optimizer.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                nesterov=args.optimizer == "nesterov")
    if hook == "localsgd":
        # The averager averages after its steps warmup, warmup + H, ...
        # (counted from 0): warmup H - 1 averages after steps H, 2H, ...
        optimizer = PostLocalSGDOptimizer(optimizer, averagers.PeriodicModelAverager(
            period=args.local_steps, warmup_steps=args.local_steps - 1))
    batch = args.batch_size // size
    steps_per_epoch = train_x.shape[0] // args.batch_size
    total_steps = steps_per_epoch * args.epochs
    if args.limit_steps:
        total_steps = min(total_steps, args.limit_steps)
    train_start = time.perf_counter()
    eval_seconds = 0.0
    step = 0
    while step < total_steps:
        epoch = step // steps_per_epoch
        shard = example.epoch_permutation(train_x.shape[0], args.seed, epoch)[rank::size]
        for k in range(steps_per_epoch):
            if step >= total_steps:
                break
            idx = shard[k * batch:(k + 1) * batch]
            optimizer.zero_grad()
            F.cross_entropy(model(train_x[idx]), train_y[idx]).backward()
            optimizer.step()
            step += 1
            if args.eval_every and step % args.eval_every == 0 and rank == 0 \
                    and step != total_steps:
                eval_start = time.perf_counter()
                accuracy = example.evaluate(model.module, test_x, test_y)
                eval_seconds += time.perf_counter() - eval_start
                train_seconds = time.perf_counter() - train_start - eval_seconds
                print(f"eval step={step} test_accuracy={accuracy:.4f} "
                      f"train_seconds={train_seconds:.2f}", file=sys.stderr, flush=True)
    if hook == "localsgd" and step % args.local_steps:
        # A last partial round is averaged too, as the example's finish() does.
        model_averaging_utils.average_parameters(iter(model.parameters()), dist.group.WORLD)
    dist.barrier()
    train_seconds = time.perf_counter() - train_start - eval_seconds
    if rank == 0:
        accuracy = example.evaluate(model.module, test_x, test_y)
        if args.eval_every:
            print(f"eval step={step} test_accuracy={accuracy:.4f} "
                  f"train_seconds={train_seconds:.2f}", file=sys.stderr, flush=True)
        print(f"test_accuracy={accuracy:.4f}")
        print(f"train_seconds={train_seconds:.1f}")
        print(f"steps={step}")
        print(f"ms_per_step={1000 * train_seconds / max(step, 1):.1f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
