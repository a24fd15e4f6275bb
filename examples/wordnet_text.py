#!/usr/bin/python3
"""A fastText-style text classifier whose embedding is a Harrier sparse
table: WordNet glosses (Debian's wordnet-base) labelled with their
lexicographer file, 45 classes (examples/wordnet_text_data.py).

    harrier-launch -np 4 -- python3 examples/wordnet_text.py     # 4 workers, sparse table
    python3 examples/wordnet_text.py --baseline                  # one process, dense buckets
    python3 examples/wordnet_text.py                             # one process, the table in it

The model is the mean of the embeddings of a gloss's word and bigram ids
(dim 64) followed by a Linear(64, 45). The ids are 64-bit hashes:

  default     harrier.torch.EmbeddingBag keeps one row per id on the
              shards, created on first use; a step pulls the batch's rows and
              its backward pushes their gradients, applied on the shards by
              the per-row optimizer (--emb_optimizer, --emb_lr). The linear
              layer's gradients are averaged over the workers by
              harrier.torch.DistributedOptimizer and applied by a torch
              optimizer on each worker (--optimizer, --lr).
  --baseline  one process: the ids folded into --buckets rows (id mod 2**22)
              of a dense torch.nn.EmbeddingBag with sparse gradients, the same
              optimizers as torch.optim classes.

Every epoch all ranks draw the same permutation; each global batch of
--batch_size examples is split into equal consecutive shares, one per rank,
so N workers see exactly the baseline's batches. Each worker's loss is the
mean over its share: the averaged dense gradient is the baseline's, and the
shards average the pushes of a row over the workers the same way. The last
incomplete batch of an epoch is dropped.

Rank 0 prints a progress line per epoch to stderr (the training figures of
its own share) and ends with stdout lines `test_accuracy=0.XXXX` (the
whole test set), `ms_per_step=N.N` (training steps only) and
`wall_seconds=N.N`.
"""

import time

START = time.perf_counter()

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import wordnet_text_data as data  # noqa: E402

OPTIMIZERS = ("sgd", "adagrad")

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument("--baseline", action="store_true",
                    help="one process, dense hashed buckets instead of a sparse table")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch_size", type=int, default=512,
                    help="global batch: each of N workers takes batch_size/N of it")
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--emb_optimizer", choices=OPTIMIZERS, default="adagrad",
                    help="the embedding's per-row optimizer")
parser.add_argument("--emb_lr", type=float, default=0.2)
parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adagrad",
                    help="the linear layer's optimizer")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--init_scale", type=float, default=0.01,
                    help="embedding rows start uniform in [-init_scale, init_scale)")
parser.add_argument("--buckets", type=int, default=1 << 22,
                    help="--baseline: rows of the dense embedding (ids mod buckets)")
parser.add_argument("--max_train", type=int, default=0,
                    help="train on a fixed random N of the training examples (0: all)")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--threads", type=int, default=0,
                    help="torch threads (0: the cores shared by the workers on this host)")
parser.add_argument("--wordnet_dir", default=data.WORDNET_DIR)
parser.add_argument("--cache_dir", default=None,
                    help="parsed data cache (default $HARRIER_DATA_CACHE or "
                         "~/.cache/harrier-data; '' for none)")
parser.add_argument("--table", default="wordnet_text/embedding",
                    help="name of the sparse table on the shards")


def torch_optimizer(kind, params, lr):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr)
    # The shards' adagrad: an accumulator per element starting at 0.
    return torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=0.0, eps=1e-8)


class BucketEmbeddingBag(nn.Module):
    """The baseline's embedding: ids folded into `buckets` dense rows."""

    def __init__(self, buckets, dim, init_scale):
        super().__init__()
        self.buckets = buckets
        self.bag = nn.EmbeddingBag(buckets, dim, mode="mean", sparse=True)
        nn.init.uniform_(self.bag.weight, -init_scale, init_scale)

    def forward(self, ids, offsets):
        return self.bag(torch.remainder(ids, self.buckets), offsets)


class TextClassifier(nn.Module):
    def __init__(self, embedding, dim):
        super().__init__()
        self.embedding = embedding
        self.fc = nn.Linear(dim, data.NUM_CLASSES)

    def forward(self, ids, offsets):
        return self.fc(self.embedding(ids, offsets))


def tensors(split, index):
    ids, offsets, labels = split.batch(index)
    return torch.from_numpy(ids), torch.from_numpy(offsets), torch.from_numpy(labels)


def main(args):
    if args.baseline:
        import types
        hvd = types.SimpleNamespace(rank=lambda: 0, size=lambda: 1)
        embedding = BucketEmbeddingBag(args.buckets, args.dim, args.init_scale)
    else:
        import harrier.torch as hvd
        hvd.init()
        embedding = hvd.EmbeddingBag(args.table, args.dim, mode="mean",
                                     optimizer=args.emb_optimizer, lr=args.emb_lr,
                                     init_scale=args.init_scale, seed=args.seed)
    rank, size = hvd.rank(), hvd.size()
    if args.batch_size % size:
        sys.exit(f"wordnet_text: --batch_size={args.batch_size} is not a multiple of "
                 f"the {size} workers")
    local_size = 1 if args.baseline else hvd.local_size()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local_size))
    torch.manual_seed(args.seed)

    train, test = data.load(args.wordnet_dir, args.cache_dir)
    train = train.subset(args.max_train)
    if rank == 0:
        print(f"wordnet_text: {data.describe(train, test)} workers={size}", file=sys.stderr,
              flush=True)

    model = TextClassifier(embedding, args.dim)
    dense = list(model.fc.parameters())
    optimizer = torch_optimizer(args.optimizer, dense, args.lr)
    if args.baseline:
        emb_optimizer = torch_optimizer(args.emb_optimizer, embedding.parameters(),
                                        args.emb_lr)
    else:
        # The sparse table's rows are stepped on the shards; only the linear
        # layer goes through a torch optimizer, its gradients averaged.
        emb_optimizer = None
        hvd.broadcast_parameters(model.fc.state_dict(), root_rank=0)
        optimizer = hvd.DistributedOptimizer(optimizer,
                                             named_parameters=model.fc.named_parameters())

    share = args.batch_size // size
    steps_per_epoch = len(train) // args.batch_size
    if steps_per_epoch == 0:
        sys.exit(f"wordnet_text: {len(train)} training examples make no batch of "
                 f"{args.batch_size}")
    steps, train_seconds, accuracy = 0, 0.0, 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = np.random.default_rng([args.seed, epoch]).permutation(len(train))
        loss_sum, correct, seen = 0.0, 0, 0
        start = time.perf_counter()
        for step in range(steps_per_epoch):
            first = step * args.batch_size + rank * share
            ids, offsets, labels = tensors(train, order[first:first + share])
            optimizer.zero_grad()
            if emb_optimizer:
                emb_optimizer.zero_grad()
            logits = model(ids, offsets)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            if emb_optimizer:
                emb_optimizer.step()
            loss_sum += loss.item() * len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            seen += len(labels)
        train_seconds += time.perf_counter() - start
        steps += steps_per_epoch
        accuracy = evaluate(model, test, hvd, rank, size)
        if rank == 0:
            print(f"wordnet_text: epoch={epoch} train_loss={loss_sum / seen:.4f} "
                  f"train_accuracy={correct / seen:.4f} test_accuracy={accuracy:.4f} "
                  f"train_seconds={train_seconds:.1f} "
                  f"wall_seconds={time.perf_counter() - START:.1f}",
                  file=sys.stderr, flush=True)
    if rank == 0:
        print(f"test_accuracy={accuracy:.4f}")
        print(f"ms_per_step={1000 * train_seconds / max(1, steps):.1f}")
        print(f"wall_seconds={time.perf_counter() - START:.1f}", flush=True)


def evaluate(model, test, hvd, rank, size, batch=2048):
    """Accuracy on the whole test set: each rank counts its part, the counts
    are summed over the ranks."""
    model.eval()
    part = np.array_split(np.arange(len(test)), size)[rank]
    correct = 0
    with torch.no_grad():
        for first in range(0, len(part), batch):
            ids, offsets, labels = tensors(test, part[first:first + batch])
            correct += int((model(ids, offsets).argmax(1) == labels).sum())
    if size > 1:
        correct = int(hvd.allreduce(torch.tensor([float(correct)]), op=hvd.Sum,
                                    name="wordnet_text.correct").item())
    return correct / len(test)


if __name__ == "__main__":
    main(parser.parse_args())
