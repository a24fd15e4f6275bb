"""PyTorch on Harrier: DistributedOptimizer and broadcast_parameters, in the
shape Horovod and BytePS users know.

    import harrier, harrier.torch as htorch
    client = harrier.Client(servers=["127.0.0.1:50061", "127.0.0.1:50062"])
    opt = htorch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                      model.named_parameters(), client=client)
    for x, y in batches:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()   # gradients pushed from the hooks
        opt.step()                                # new parameters pulled into the model
    opt.finish(); client.barrier("done"); opt.refresh(); client.leave()

Where the update happens (`update`):
  "server"  each parameter's gradient is pushed from its backward hook as
            soon as it is ready; the shards' optimizer (their --optimizer,
            --lr) applies the average; step() pulls the result. The local
            optimizer only supplies zero_grad and state_dict.
  "worker"  step() runs the local optimizer, then pushes the change of the
            parameters (old - new) and pulls the shards' average: model
            averaging every H steps under --sync=local (the shards subtract
            the averaged delta as it is), every step otherwise (then run the
            shards with --optimizer=sgd --lr=1 so they do the same).
  "auto"    "worker" under local SGD, else "server".
"""

import numpy as _np
import torch as _torch

import harrier as _harrier

__all__ = ["DistributedOptimizer", "broadcast_parameters"]

_default_client = None


def _bad(message):
    return _harrier.InvalidArgumentError(message, "INVALID_ARGUMENT", 3)


def _numpy_view(tensor):
    """The float32 CPU tensor's memory as numpy (no copy)."""
    return tensor.detach().numpy()


class DistributedOptimizer:
    """Wraps `optimizer` so that step() trains through the parameter servers.

    named_parameters: (name, parameter) pairs, front of the model first (the
    order gives the comm scheduler's priorities); names must be the same on
    every worker; every worker starts from rank 0's values (a barrier
    at construction). client: a harrier.Client, or None to create one from
    `servers`, `rank`, `codec`, `pull_codec`, `transport` and **client_options.
    sync: None (whatever the shards run) or the mode this code expects
    ("bsp", "ssp", "asp", "local"): a mismatch is an error, not a surprise.
    techniques: None (each gradient pushed from its hook, the parameters
    pulled in step()) or comm scheduler techniques ("all", "wfbp+fusion",
    ...). model: with a scheduler, the module whose forward pre-hooks wait for
    each layer's parameters, so the next forward starts before the last
    pull arrives; call synchronize() to have every parameter current.
    backward_passes_per_step: backward() calls accumulated per step().
    """

    def __init__(self, optimizer, named_parameters, client=None, servers=None, rank=None,
                 codec="none", pull_codec="none", transport="grpc", sync=None, update="auto",
                 techniques=None, model=None, prefix="", fusion_bytes=0, partition_bytes=0,
                 max_inflight_bytes=0, wait_timeout=120.0, backward_passes_per_step=1,
                 **client_options):
        global _default_client
        if client is None:
            if servers is None:
                raise _bad("DistributedOptimizer needs client= or servers=")
            client = _harrier.Client(servers=servers, rank=rank, codec=codec,
                                     pull_codec=pull_codec, transport=transport, **client_options)
        elif servers is not None or codec != "none" or pull_codec != "none" or client_options:
            raise _bad("codec, pull_codec, servers and client options belong to the Client; "
                       "pass them to harrier.Client, or pass no client=")
        self._client = client
        _default_client = client
        self._optimizer = optimizer
        self._sync = client.sync
        mode = self._sync["mode"]
        if sync is not None and sync != mode:
            raise _bad(f"sync={sync!r} was asked for, but the shards run {mode!r} "
                       "(their --sync flag decides)")
        if update == "auto":
            update = "worker" if mode == "local" else "server"
        if update not in ("server", "worker"):
            raise _bad(f"update must be 'server', 'worker' or 'auto', got {update!r}")
        if update == "server" and mode == "local":
            raise _bad("local SGD updates on the worker: use update='worker' (or 'auto')")
        if update == "worker" and techniques is not None:
            raise _bad("the comm scheduler overlaps gradient pushes with backward; with "
                       "update='worker' there are none (deltas go after the local step)")
        if int(backward_passes_per_step) < 1:
            raise _bad("backward_passes_per_step must be >= 1")
        self._update = update
        self._local_steps = max(1, int(self._sync["local_steps"])) if mode == "local" else 1
        self._passes_per_step = int(backward_passes_per_step)

        self._names, self._params = [], []
        seen = set()
        for name, param in named_parameters:
            if not param.requires_grad:
                continue
            if name in seen:
                raise _bad(f"parameter name {name!r} appears twice")
            if param.device.type != "cpu" or param.dtype != _torch.float32:
                raise _bad(f"parameter {name!r}: {param.dtype} on {param.device}; the Python "
                           "client trains float32 CPU parameters")
            if not param.is_contiguous():
                raise _bad(f"parameter {name!r} is not contiguous")
            seen.add(name)
            self._names.append(prefix + name)
            self._params.append(param)
        if not self._params:
            raise _bad("no parameters that require gradients")
        # Own copies of each gradient as pushed: the hook's p.grad may be
        # zeroed or accumulated into before the push has left.
        self._grads = [_np.zeros(p.shape, dtype=_np.float32) for p in self._params]
        self._pulled = [_np.zeros(p.shape, dtype=_np.float32) for p in self._params]
        self._passes = [0] * len(self._params)
        self._handed = [False] * len(self._params)
        self._handles = [None] * len(self._params)
        self._current = [techniques is None] * len(self._params)
        self._steps = 0
        self._scheduler = None
        self._hooks = []
        # With a scheduler and a model, parameters are made current layer by
        # layer in forward pre-hooks instead of at the end of step().
        self._forward_hooked = model is not None and techniques is not None

        # Every worker starts from rank 0's values: rank 0 registers first
        # (the first registration wins), the others after a barrier.
        round_ = getattr(client, "_optimizers", 0)
        client._optimizers = round_ + 1
        barrier = f"harrier.torch/{round_}/{prefix}registered"
        if client.rank != 0:
            client.barrier(barrier)
        if techniques is not None:
            # Pulled parameters land in staging arrays and are copied into
            # the model when needed: never behind autograd's back mid-backward.
            self._scheduler = _harrier.Scheduler(
                client, list(zip(self._names, self._pulled_from_params())), techniques,
                fusion_bytes, partition_bytes, max_inflight_bytes, wait_timeout)
        else:
            for name, param in zip(self._names, self._params):
                client.register(name, _numpy_view(param))
        if client.rank == 0:
            client.barrier(barrier)
        if techniques is not None:
            for i in range(len(self._params)):
                self._make_current(i)
        else:
            for name, param in zip(self._names, self._params):
                client.pull(name, _numpy_view(param))  # rank 0's values
        if update == "worker":
            self._round_start = [_numpy_view(p).copy() for p in self._params]
        else:
            self._install_gradient_hooks()
        if model is not None and self._scheduler is not None:
            self._install_forward_hooks(model)

    def _pulled_from_params(self):
        for i, param in enumerate(self._params):
            self._pulled[i][...] = _numpy_view(param)
        return self._pulled

    # -- hooks ------------------------------------------------------------
    def _install_gradient_hooks(self):
        for i, param in enumerate(self._params):
            # The gradient accumulator's hook runs once param.grad is final
            # for this backward pass (Horovod's and BytePS's choice too).
            accumulator = param.expand_as(param).grad_fn.next_functions[0][0]
            self._hooks.append((accumulator, accumulator.register_hook(self._gradient_hook(i))))

    def _gradient_hook(self, i):
        def hook(*unused):
            self._passes[i] += 1
            if self._passes[i] == self._passes_per_step:
                self._hand_over(i)
        return hook

    def _install_forward_hooks(self, model):
        index = {id(p): i for i, p in enumerate(self._params)}
        for module in model.modules():
            mine = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
            if mine:
                self._hooks.append((module, module.register_forward_pre_hook(
                    self._forward_hook(mine))))

    def _forward_hook(self, indices):
        def hook(module, inputs):
            for i in indices:
                self._make_current(i)
        return hook

    def _make_current(self, i):
        """With a scheduler: tensor i's pulled parameters into the model."""
        if not self._current[i]:
            self._scheduler.wait_parameters(i)
            with _torch.no_grad():
                _numpy_view(self._params[i])[...] = self._pulled[i]
            self._current[i] = True

    def _hand_over(self, i):
        """Pushes parameter i's gradient for this step (once per step)."""
        if self._handed[i]:
            return
        param = self._params[i]
        if self._scheduler is not None:
            self._make_current(i)  # the scheduler is done with the last gradient buffer
        if param.grad is None:
            self._grads[i].fill(0.0)  # unused this step: BSP still needs a push
        else:
            self._grads[i][...] = _numpy_view(param.grad.to(_torch.float32))
        self._handed[i] = True
        if self._scheduler is not None:
            self._scheduler.gradient_ready(i, self._grads[i])
        else:
            self._handles[i] = self._client.push_pull_async(self._names[i], self._grads[i],
                                                            self._pulled[i])

    # -- the optimizer API ------------------------------------------------
    def step(self, closure=None):
        loss = None
        if self._update == "worker":
            loss = self._optimizer.step(closure)
            self._steps += 1
            if self._steps % self._local_steps == 0:
                self._average_models()
            return loss
        if closure is not None:
            with _torch.enable_grad():
                loss = closure()
        # Parameters without a gradient this step (unused layers) still push.
        for i in reversed(range(len(self._params))):
            self._hand_over(i)
        if self._scheduler is not None:
            self._scheduler.end_backward()
            self._current = [False] * len(self._params)
            self._steps += 1
            if not self._forward_hooked:
                self.synchronize()
        else:
            self._wait_all()
            self._client.clock()
            with _torch.no_grad():
                for param, pulled in zip(self._params, self._pulled):
                    _numpy_view(param)[...] = pulled
            self._steps += 1
        self._handed = [False] * len(self._params)
        self._passes = [0] * len(self._params)
        return loss

    def _wait_all(self):
        error = None
        for i, handle in enumerate(self._handles):
            if handle is None:
                continue
            try:
                handle.wait()
            except _harrier.Error as e:
                error = error or e
            self._handles[i] = None
        if error is not None:
            raise error

    def _average_models(self):
        for i, param in enumerate(self._params):
            self._grads[i][...] = self._round_start[i] - _numpy_view(param)
            self._handles[i] = self._client.push_pull_async(self._names[i], self._grads[i],
                                                            self._pulled[i])
        self._wait_all()
        self._client.clock()
        with _torch.no_grad():
            for i, param in enumerate(self._params):
                _numpy_view(param)[...] = self._pulled[i]
                self._round_start[i][...] = self._pulled[i]

    def synchronize(self):
        """Every parameter current in the model (with a scheduler and a model,
        forward pre-hooks otherwise do this layer by layer)."""
        if self._scheduler is not None:
            for i in range(len(self._params)):
                self._make_current(i)

    def finish(self):
        """After the last step: nothing left in flight, the model holds the
        parameters after this worker's last push (under local SGD, a last
        partial round is averaged first)."""
        if self._update == "worker" and self._steps % self._local_steps != 0:
            self._average_models()
        self._wait_all()
        if self._scheduler is not None:
            self._scheduler.drain()
            self.synchronize()

    def refresh(self):
        """Pulls every parameter again at the current clock (after a final
        barrier: every worker's last update included)."""
        if self._scheduler is not None:
            self._scheduler.refresh()  # into the staging arrays
            with _torch.no_grad():
                for param, pulled in zip(self._params, self._pulled):
                    _numpy_view(param)[...] = pulled
            return
        with _torch.no_grad():
            for name, param in zip(self._names, self._params):
                self._client.pull(name, _numpy_view(param))

    def zero_grad(self, set_to_none=False):
        self._optimizer.zero_grad(set_to_none=set_to_none)

    @property
    def client(self):
        return self._client

    @property
    def optimizer(self):
        return self._optimizer

    @property
    def update(self):
        return self._update

    @property
    def param_groups(self):
        return self._optimizer.param_groups

    def state_dict(self):
        return self._optimizer.state_dict()

    def load_state_dict(self, state):
        self._optimizer.load_state_dict(state)

    def stats(self):
        """The client's counters, and the scheduler's when there is one."""
        out = dict(self._client.stats())
        out["steps"] = self._steps
        if self._scheduler is not None:
            out["scheduler"] = self._scheduler.stats()
        return out

    def close(self):
        for _, handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self._scheduler is not None:
            self._scheduler.close()


def broadcast_parameters(params, root_rank=0, client=None):
    """Every worker's tensors get root_rank's values. params: a state_dict
    or (name, tensor) pairs, the same names on every worker. Tensors are
    staged through the shards as float32 (integer entries such as counters
    are exact below 2**24). Each call adds its tensors to the shards."""
    client = client or _default_client
    if client is None:
        raise _bad("broadcast_parameters needs client= (or a DistributedOptimizer created first)")
    if not 0 <= root_rank < client.num_workers:
        raise _bad(f"root_rank {root_rank} is not in [0, {client.num_workers})")
    items = list(params.items()) if hasattr(params, "items") else list(params)
    round_ = getattr(client, "_broadcasts", 0)
    client._broadcasts = round_ + 1
    prefix = f"harrier.broadcast/{round_}/"
    tensors = [(name, t) for name, t in items if isinstance(t, _torch.Tensor) and t.numel() > 0]
    if client.rank == root_rank:
        for name, tensor in tensors:
            client.register(prefix + name, tensor.detach().reshape(-1).to(_torch.float32).numpy())
    client.barrier(prefix + "registered")
    if client.rank != root_rank:
        with _torch.no_grad():
            for name, tensor in tensors:
                client.register(prefix + name, (tensor.numel(),))
                values = client.pull(prefix + name)
                tensor.copy_(_torch.from_numpy(values).reshape(tensor.shape).to(tensor.dtype))
