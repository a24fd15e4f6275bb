"""One worker of sparse_test.py. It joins the job from the environment
(HARRIER_SERVERS, HARRIER_RANK, ...) and writes what it saw to --out
(.npz).

Scenarios: "binding" (harrier.Client's sparse calls, sync and async, with
integer gradients that keep SGD at lr 1 exact) and "model" (an
EmbeddingBag on the shards and a Linear through DistributedOptimizer,
each rank on its half of every batch)."""

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import harrier
import harrier.torch as hvd

DIM = 4


# -- binding ------------------------------------------------------------------

def binding_ids(rank):
    """Rank r's ids at every step: 0..9 for everyone (3 twice, half its
    gradient each time) and 100 + r for r alone."""
    return np.array(list(range(10)) + [3, 100 + rank], dtype=np.int64)


def binding_gradient(rank, ids):
    """Integers: sums and averages of two stay exact in float32."""
    j = np.arange(DIM, dtype=np.float32)
    g = (rank + 1) * (ids[:, None] % 5 + 1).astype(np.float32) * (j[None, :] + 1)
    return np.where(ids[:, None] == 3, g * 0.5, g).astype(np.float32)


def binding(args):
    client = hvd._job.client  # the harrier.Client init() made
    client.register_sparse("rows", DIM, optimizer="sgd", lr=1.0, init_scale=0.0)
    rank = client.rank
    ids = binding_ids(rank)
    grads = binding_gradient(rank, ids)
    pulled = []
    for step in range(args.steps):
        if step % 2 == 0:  # the blocking calls, ids as numpy and as torch
            rows = client.pull_rows("rows", torch.from_numpy(ids))
            pulled.append(rows)
            client.push_rows("rows", ids, torch.from_numpy(grads))
        else:              # the async ones, into a given output
            out = np.empty((len(ids), DIM), dtype=np.float32)
            pulled.append(client.pull_rows_async("rows", ids, out).wait(timeout=60))
            handle = client.push_rows_async("rows", ids, grads)
            assert handle.wait(timeout=60) is None
    clock = client.tensor_clock("rows")
    # After every worker's last push: int32 ids are copied to int64.
    final = client.pull_rows("rows", ids.astype(np.int32))
    stats = client.sparse_stats("rows")
    np.savez(args.out, ids=ids, pulled=np.stack(pulled), final=final, clock=clock,
             ids_requested=stats["ids_requested"], rows_pulled=stats["rows_pulled"],
             rows_pushed=stats["rows_pushed"])


# -- model ----------------------------------------------------------------------

CLASSES = 3
VOCABULARY = 40


def model_data(steps, batch, seed=5):
    """`steps` batches of `batch` bags over a vocabulary of hashed int64 ids
    (any values, negative ones too): per step, ids, the bags' offsets and
    the labels; each bag 1..5 ids long."""
    rng = np.random.default_rng(seed)
    vocabulary = rng.integers(-(1 << 62), 1 << 62, size=VOCABULARY, dtype=np.int64)
    data = []
    for _ in range(steps):
        lengths = rng.integers(1, 6, size=batch)
        ids = vocabulary[rng.integers(0, VOCABULARY, size=int(lengths.sum()))]
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        labels = rng.integers(0, CLASSES, size=batch).astype(np.int64)
        data.append((ids, offsets, labels))
    return vocabulary, data


def half(ids, offsets, labels, rank, workers):
    """Rank's share of a batch's bags (contiguous, equal counts)."""
    part = len(labels) // workers
    first, last = rank * part, (rank + 1) * part
    ends = np.concatenate([offsets[1:], [len(ids)]])
    start, stop = offsets[first], ends[last - 1]
    return ids[start:stop], offsets[first:last] - start, labels[first:last]


def linear(seed=3):
    torch.manual_seed(seed)
    return torch.nn.Linear(DIM, CLASSES)


class Classifier(torch.nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.embedding = embedding
        self.fc = linear()

    def forward(self, ids, offsets):
        return self.fc(torch.tanh(self.embedding(ids, offsets)))


def model(args):
    rank, workers = hvd.rank(), hvd.size()
    embedding = hvd.EmbeddingBag("bag", DIM, mode="mean", optimizer="sgd", lr=args.lr,
                                 init_scale=0.5, seed=7)
    net = Classifier(embedding)
    if rank != 0:  # other initial values: rank 0's win through the broadcast
        with torch.no_grad():
            net.fc.weight.add_(1.0)
    hvd.broadcast_parameters(net.fc.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(net.fc.parameters(), lr=args.lr),
                                         named_parameters=net.fc.named_parameters())
    vocabulary, data = model_data(args.steps, args.batch)
    losses = []
    for ids, offsets, labels in data:
        ids, offsets, labels = (torch.from_numpy(a) for a in half(ids, offsets, labels, rank,
                                                                   workers))
        optimizer.zero_grad()
        loss = F.cross_entropy(net(ids, offsets), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        # An evaluation forward between steps pushes nothing.
        with torch.no_grad():
            net(ids, offsets)
    clock = hvd._job.client.tensor_clock("bag")
    with torch.no_grad():  # every rank's last push is in (BSP)
        rows = embedding(torch.from_numpy(vocabulary), torch.arange(VOCABULARY))
    np.savez(args.out, losses=np.array(losses), rows=rows.numpy(), clock=clock,
             weight=net.fc.weight.detach().numpy(), bias=net.fc.bias.detach().numpy())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init(rpc_timeout=60.0)
    {"binding": binding, "model": model}[args.scenario](args)


if __name__ == "__main__":
    main()
