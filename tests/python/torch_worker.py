"""One worker of torch_test.py: trains a small MLP through
harrier.torch.DistributedOptimizer and writes its losses and final
parameters to --out (an .npz)."""

import argparse

import numpy as np
import torch
import torch.nn.functional as F

import harrier
import harrier.torch as htorch


def model_and_data(seed, steps, batch):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    generator = torch.Generator().manual_seed(seed + 1)
    centers = torch.randn(3, 20, generator=generator) * 2
    labels = torch.randint(0, 3, (steps, batch), generator=generator)
    inputs = centers[labels] + torch.randn(steps, batch, 20, generator=generator)
    return model, inputs, labels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16, help="per worker")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--techniques", default="")
    parser.add_argument("--update", default="auto")
    parser.add_argument("--codec", default="none")
    parser.add_argument("--broadcast", action="store_true")
    parser.add_argument("--fusion_bytes", type=int, default=0)
    parser.add_argument("--forward_order_tail", default="0", help="a fraction or 'measure'")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    model, inputs, labels = model_and_data(0, args.steps, args.batch * args.workers)
    if args.rank != 0:  # different initial values: rank 0's must win
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    client = harrier.Client(servers=args.servers.split(","), rank=args.rank, codec=args.codec,
                            compress_min_bytes=0, rpc_timeout=60)
    optimizer = htorch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr), model.named_parameters(), client=client,
        update=args.update, techniques=args.techniques or None,
        model=model if args.techniques else None, fusion_bytes=args.fusion_bytes,
        forward_order_tail=(args.forward_order_tail if args.forward_order_tail == "measure"
                            else float(args.forward_order_tail)))
    broadcast = None
    if args.broadcast:
        state = {"table": torch.full((5, 3), float(args.rank + 1)),
                 "counter": torch.tensor([7 + args.rank], dtype=torch.int64)}
        htorch.broadcast_parameters(state, root_rank=1)
        broadcast = np.concatenate([state["table"].numpy().ravel(),
                                    state["counter"].numpy().astype(np.float32)])
    losses = []
    lo, hi = args.rank * args.batch, (args.rank + 1) * args.batch
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs[step, lo:hi]), labels[step, lo:hi])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # Arrays of the optimizer's own beside the model (pushes from p.grad and
    # pulls into p need none without the scheduler).
    staged = sum(a is not None for a in optimizer._grads + optimizer._pulled)
    optimizer.finish()
    client.barrier("done")
    optimizer.refresh()
    stats = optimizer.stats()
    scheduler = stats.get("scheduler", {})
    client.leave()
    params = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    np.savez(args.out, losses=np.array(losses), params=params,
             broadcast=broadcast if broadcast is not None else np.zeros(0),
             bytes_pushed=stats["bytes_pushed"], pushes=stats["pushes"], staged=staged,
             tail=scheduler.get("forward_order_tail", -1),
             tail_estimate=scheduler.get("measured_forward_order_tail", -1),
             tail_from_step=scheduler.get("forward_order_tail_from_step", -1))


if __name__ == "__main__":
    main()
