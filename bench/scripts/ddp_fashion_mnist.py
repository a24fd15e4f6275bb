#!/usr/bin/python3
"""examples/horovod_style_fashion_mnist.py's model, data, sampler and
optimizer under PyTorch DistributedDataParallel over gloo: what a user
would run instead of Harrier. One process per rank with MASTER_ADDR,
MASTER_PORT, RANK and WORLD_SIZE set, as torchrun sets them
(bench/scripts/horovod_vs_ddp.sh starts them); rank 0 prints
test_accuracy= and ms_per_step= as the example does."""

import importlib.util
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "horovod_style_fashion_mnist.py")


def load_example():
    spec = importlib.util.spec_from_file_location("horovod_style", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # definitions only: its main is guarded
    return module


def main():
    example = load_example()
    args = example.parser.parse_args()
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train_dataset = example.dataset(args.data_dir, "train", args.train_examples)
    test_dataset = example.dataset(args.data_dir, "t10k")
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=size, rank=rank)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    model = torch.nn.parallel.DistributedDataParallel(example.Net())  # broadcasts rank 0's
    optimizer = optim.SGD(model.parameters(), lr=args.lr * size, momentum=args.momentum)
    steps, seconds = 0, 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        start = time.perf_counter()
        for data, target in train_loader:
            optimizer.zero_grad()
            F.nll_loss(model(data), target).backward()
            optimizer.step()
            steps += 1
        seconds += time.perf_counter() - start
    model.eval()
    correct = torch.zeros(2)
    with torch.no_grad():
        sampler = torch.utils.data.distributed.DistributedSampler(
            test_dataset, num_replicas=size, rank=rank, shuffle=False)
        for data, target in torch.utils.data.DataLoader(test_dataset, batch_size=1000,
                                                        sampler=sampler):
            correct[0] += model(data).argmax(1).eq(target).sum()
            correct[1] += len(target)
    dist.all_reduce(correct)
    if rank == 0:
        print(f"test_accuracy={float(correct[0] / correct[1]):.4f}")
        print(f"ms_per_step={1000 * seconds / max(1, steps):.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
