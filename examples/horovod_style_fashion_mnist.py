#!/usr/bin/python3
"""A PyTorch training script written the way Horovod users write them, run
on Harrier by changing one line: `import horovod.torch as hvd` became
`import harrier.torch as hvd`.

    harrier-launch -np 4 -- python3 examples/horovod_style_fashion_mnist.py
    python3 examples/horovod_style_fashion_mnist.py        # one process, no shards

It follows the shape of Horovod's own PyTorch MNIST example: init(), the
learning rate scaled by size(), a DistributedSampler over the ranks,
broadcast_parameters and broadcast_optimizer_state from rank 0, a
DistributedOptimizer with a Compression argument, op and
gradient_predivide_factor, and the test metrics averaged with allreduce.
Nothing at the end: the job is left at exit. The data are the IDX files of
Debian's dataset-fashion-mnist (MNIST's format, harder images). Rank 0
ends with `test_accuracy=0.XXXX` and `ms_per_step=` (training steps only,
bench/scripts/horovod_vs_ddp.sh compares it with PyTorch DDP).
"""

import argparse
import gzip
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data
import torch.utils.data.distributed

import harrier.torch as hvd

parser = argparse.ArgumentParser(description="PyTorch Fashion-MNIST, Horovod style",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--batch-size", type=int, default=64, help="input batch size per worker")
parser.add_argument("--test-batch-size", type=int, default=1000)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01, help="learning rate of one worker")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--log-interval", type=int, default=100,
                    help="batches between progress lines")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="fp16 compression of the gradients")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--train-examples", type=int, default=0,
                    help="use only the first N training images (0: all 60000)")
parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")


def read_idx(path, dims):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def dataset(data_dir, prefix, limit=0):
    def path(name):
        plain = os.path.join(data_dir, name)
        return plain if os.path.exists(plain) else plain + ".gz"
    images = read_idx(path(f"{prefix}-images-idx3-ubyte"), 3)
    labels = read_idx(path(f"{prefix}-labels-idx1-ubyte"), 1)
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = (torch.from_numpy(images.astype(np.float32) / 255.0) - 0.2860) / 0.3530
    return torch.utils.data.TensorDataset(x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(epoch):
    """Returns the steps taken and the seconds they took."""
    model.train()
    # Horovod: each epoch, a new order of this rank's part of the data.
    train_sampler.set_epoch(epoch)
    start = time.perf_counter()
    batch_idx = -1
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                  f"\tLoss: {loss.item():.6f}", file=sys.stderr, flush=True)
    return batch_idx + 1, time.perf_counter() - start


def metric_average(val, name):
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test():
    model.eval()
    test_loss = 0.0
    test_accuracy = 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1)
            test_accuracy += pred.eq(target).float().sum().item()
    # Horovod: each rank tested its part of the test set; average the metrics.
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    test_loss = metric_average(test_loss, "avg_loss")
    test_accuracy = metric_average(test_accuracy, "avg_accuracy")
    if hvd.rank() == 0:
        print(f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%",
              file=sys.stderr, flush=True)
    return test_accuracy


if __name__ == "__main__":
    args = parser.parse_args()

    # Horovod: initialize the library.
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    train_dataset = dataset(args.data_dir, "train", args.train_examples)
    test_dataset = dataset(args.data_dir, "t10k")
    # Horovod: a sampler per rank, so each rank trains on its own part.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    # Horovod: scale the learning rate by the number of workers (the global
    # batch is size() times larger).
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)

    # Horovod: every rank starts from rank 0's parameters and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    # Horovod: wrap the optimizer; gradients are averaged over the ranks.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    accuracy, steps, seconds = 0.0, 0, 0.0
    for epoch in range(1, args.epochs + 1):
        epoch_steps, epoch_seconds = train(epoch)
        steps, seconds = steps + epoch_steps, seconds + epoch_seconds
        accuracy = test()
    if hvd.rank() == 0:
        print(f"test_accuracy={accuracy:.4f}")
        print(f"ms_per_step={1000 * seconds / max(1, steps):.1f}")
