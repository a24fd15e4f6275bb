"""ms per training step of a float32 MLP of about --mib MiB of parameters
through harrier.torch's DistributedOptimizer, run under harrier-launch:
the size at which the Python path's own copies of gradients and
parameters would show. Rank 0 prints one JSON line.

  harrier-launch -np 1 --base_port=0 [--server_args="--optimizer=sgd --lr=0.01"] -- \\
      python3 bench/scripts/torch_step.py --mib=64 --update=average

--update=average (the default: your optimizer on the averaged gradients)
or server (the shards' optimizer: start them with matching
--server_args)."""

import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F

import harrier.torch as hvd


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=float, default=64.0, help="parameters, MiB of float32")
    parser.add_argument("--update", default="average", choices=("average", "server"))
    parser.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width = 1024
    layers = max(1, int(args.mib * (1 << 20) / 4 / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters(),
                                         update=args.update)
    inputs = torch.randn(args.batch, width)
    target = torch.randn(args.batch, width)
    times = []
    for step in range(args.steps + 3):
        begin = time.perf_counter()
        optimizer.zero_grad()
        F.mse_loss(model(inputs), target).backward()
        optimizer.step()
        if step >= 3:
            times.append(time.perf_counter() - begin)
    times.sort()
    parameters = sum(p.numel() for p in model.parameters())
    if hvd.rank() == 0:
        print(json.dumps({"bench": "torch_step", "update": args.update, "workers": hvd.size(),
                          "parameter_mib": round(4 * parameters / (1 << 20), 1),
                          "steps": args.steps,
                          "median_ms_per_step": round(1000 * times[len(times) // 2], 1),
                          "min_ms_per_step": round(1000 * times[0], 1),
                          "max_rss_mib": round(resource.getrusage(
                              resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
