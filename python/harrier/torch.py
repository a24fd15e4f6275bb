"""PyTorch on Harrier, in the shape Horovod and BytePS users write.

    import harrier.torch as hvd
    hvd.init()                                    # the job, from harrier-launch's environment
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.5)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()   # gradients pushed from the hooks
        optimizer.step()                          # your optimizer on the averaged gradients
    test_loss = hvd.allreduce(torch.tensor(test_loss), name="avg_loss")

Run it with `harrier-launch -np 4 -H a:2,b:2 -- python3 train.py` (or
`-np 2` alone on one machine). The job leaves by itself at exit.

Embeddings keyed by any int64 id live on the shards as sparse tables:
Embedding and EmbeddingBag pull the rows a batch uses in forward and push
their gradients in backward, and the shards' per-row optimizer steps them
(no torch optimizer for them; the dense layers beside them go through
DistributedOptimizer as above).

Where the update happens (DistributedOptimizer's `update`):
  "average" each parameter's gradient goes from its backward hook to the
            shards, which average each step's gradients over the workers
            (a round per step, whatever the shards' --sync); step() writes
            the average into .grad and runs your optimizer as written (its
            lr, momentum, schedule, param groups). Horovod's and BytePS's
            model, and the default under init().
  "server"  the shards' optimizer (their --optimizer, --lr) applies the
            average under their --sync (BSP, SSP, ASP); step() pulls the
            parameters. Asked for explicitly, it refuses an optimizer whose
            settings differ from the shards' where it can tell.
  "worker"  step() runs the local optimizer, then pushes the change of the
            parameters (old - new) and pulls the shards' average: model
            averaging every H steps under --sync=local (the shards subtract
            the averaged delta as it is), every step otherwise (the shards
            must run --optimizer=sgd --lr=1, which is checked).
  "auto"    under init(): "worker" under local SGD, else "average"; with
            client= or servers= (the older API): "worker" under local SGD,
            else "server".
"""

import atexit as _atexit
import contextlib as _contextlib
import io as _io
import math as _math
import os as _os
import pickle as _pickle
import sys as _sys
import threading as _threading
import weakref as _weakref

import numpy as _np
import torch as _torch

import harrier as _harrier
from harrier import _harrier as _native
from harrier import sparse_rows as _sparse_rows

__all__ = [
    "init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
    "DistributedOptimizer", "Compression", "Average", "Sum", "Adasum",
    "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "push_pull",
    "push_pull_async", "synchronize", "join", "barrier", "nccl_built", "mpi_built",
    "gloo_built", "mpi_threads_supported", "cuda_built", "Embedding", "EmbeddingBag",
    "EmbeddingBagCollection", "start_timeline", "stop_timeline",
]

_default_client = None


def _bad(message):
    return _harrier.InvalidArgumentError(message, "INVALID_ARGUMENT", 3)


def _same_memory(a, b):
    """Whether tensors a and b are the same elements of the same memory."""
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def _numpy_view(tensor):
    """The float32 CPU tensor's memory as numpy (no copy)."""
    return tensor.detach().numpy()


def _check_device(tensor, what, cuda=True, staged=False):
    """CPU tensors, and CUDA tensors where the module was built with CUDA
    (`cuda`: where the caller has a device path; `staged`: the caller copies
    through host memory anyway); otherwise one line saying why, rather than
    a copy behind the caller's back."""
    if tensor.device.type == "cpu" or (staged and tensor.device.type == "cuda"):
        return
    if tensor.device.type == "cuda" and cuda:
        if _native.built_with_cuda:
            return
        raise _bad(f"{what}: a tensor on {tensor.device}, but this Harrier module was built "
                   "without CUDA (build it with `bazel build --config=cuda //python:package` "
                   "where the CUDA toolkit is; python/README.md, 'CUDA tensors')")
    raise _bad(f"{what}: a tensor on {tensor.device}; this harrier.torch trains CPU tensors"
               f"{', and CUDA tensors with the default update' if tensor.device.type == 'cuda' else ''}"
               " (move it with .cpu())")


# -- the job ----------------------------------------------------------------

# Reductions, as Horovod names them.
Average = "average"
Sum = "sum"
Adasum = "adasum"


class Compression:
    """Gradient compression for DistributedOptimizer and allreduce, as
    Horovod's hvd.Compression: Compression.none, Compression.fp16, or any
    Harrier codec (common/codec/README.md) through the functions below,
    e.g. Compression.topk(0.01), Compression.powersgd(2). The values are
    codec specs; Compression.spec("qsgd:levels=16") passes one through."""

    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"
    efsign = "efsign"
    onebit = "onebit"

    @staticmethod
    def topk(ratio):
        return f"topk:ratio={float(ratio)}"

    @staticmethod
    def randomk(ratio):
        return f"randomk:ratio={float(ratio)}"

    @staticmethod
    def threshold(tau):
        return f"threshold:tau={float(tau)}"

    @staticmethod
    def qsgd(levels=16, bucket=512):
        return f"qsgd:levels={int(levels)},bucket={int(bucket)}"

    @staticmethod
    def terngrad(clip=2.5):
        return f"terngrad:clip={float(clip)}"

    @staticmethod
    def powersgd(rank=2):
        return f"powersgd:rank={int(rank)}"

    @staticmethod
    def spec(text):
        return str(text)


# Codecs whose rounds are a vote, not an average: no gradient average to
# hand to an optimizer.
_VOTE_CODECS = ("sign", "signum")


def _codec_of(compression):
    if compression is None:
        return "none"
    if not isinstance(compression, str):
        raise _bad(f"compression must be a Compression value or a codec spec, got "
                   f"{type(compression).__name__}")
    return compression


class _Job:
    """What init() set up: the client and where this process sits."""

    def __init__(self, client, local_rank, local_size):
        self.client = client
        self.local_rank = local_rank
        self.local_size = local_size
        self.lock = _threading.Lock()
        self.registered = {}   # average tensor name -> (elements, codec)
        self.unnamed = {}      # op -> calls without a name so far
        self.broadcasts = 0
        self.optimizers = _weakref.WeakSet()
        self.sparse_tables = {}  # name -> _SparseTable, shared by the modules of that name
        self.left = False

    def collective_name(self, op, name):
        with self.lock:
            if name is None:
                count = self.unnamed.get(op, 0)
                self.unnamed[op] = count + 1
                return f"harrier.{op}/noname.{count}"
            return f"harrier.{op}/{name}"

    def ensure_average(self, key, elements, codec, memory="host", pull_codec="paired"):
        """Registers the average tensor `key` once per process. With
        pull_codec "paired" a compressed one pulls with its codec's pair, as
        Horovod's compression compresses the result too (an uncompressed one
        keeps the client's pull codec); any other codec spec ("none": dense)
        is used as it is."""
        with self.lock:
            known = self.registered.get(key)
        if known is not None:
            if known != (elements, codec, memory, pull_codec):
                raise _bad(f"'{key}': {elements} elements in {memory} memory with compression "
                           f"{codec!r} and pull compression {pull_codec!r}, but it was first "
                           f"used with {known[0]} elements in {known[2]} memory, {known[1]!r} "
                           f"and {known[3]!r}")
            return
        pull = ("paired" if codec != "none" else "") if pull_codec == "paired" else pull_codec
        self.client.register(key, (elements,), kind="average", codec=codec, pull_codec=pull,
                             memory=memory)
        with self.lock:
            self.registered[key] = (elements, codec, memory, pull_codec)

    def sparse_table(self, name, dim, options):
        """The sparse table `name`, registered on first use; every module of
        that name in this process shares it (and must ask for the same)."""
        with self.lock:
            table = self.sparse_tables.get(name)
            if table is None:
                self.client.register_sparse(name, dim, **options)
                table = self.sparse_tables[name] = _SparseTable(self.client, name, dim, options)
        if (table.dim, table.options) != (dim, options):
            changed = ["dim"] if dim != table.dim else []
            changed += sorted(k for k in set(options) | set(table.options)
                              if options.get(k) != table.options.get(k))
            raise _bad(f"sparse table '{name}': {', '.join(changed)} differ from its first use "
                       f"in this process (now dim {dim}, {options}; then dim {table.dim}, "
                       f"{table.options})")
        return table

    def finish_sparse(self):
        """Waits for every sparse table's pushes in flight."""
        error = None
        for table in list(self.sparse_tables.values()):
            try:
                table.synchronize()
            except _harrier.Error as e:
                error = error or e
        if error is not None:
            raise error


class _Done:
    """A handle whose result is already there."""

    def __init__(self, result):
        self.result = result

    def wait(self, timeout=None):
        return self.result


class _LocalTable:
    """A sparse table of a single-process job: its rows, clock and counters."""

    def __init__(self, rows):
        self.rows = rows
        self.clock = 0
        self.stats = {"rows_pulled": 0, "rows_pushed": 0, "ids_requested": 0, "cache_hits": 0,
                      "cache_misses": 0, "bytes_pushed": 0, "bytes_pulled": 0}


class _LocalClient:
    """A job of one worker and no shards (`python3 train.py` without a
    launcher, as Horovod runs it): every collective returns its input, and
    DistributedOptimizer steps the optimizer on the gradients as they are."""

    rank = 0
    num_workers = 1
    num_shards = 0
    sync = {"mode": "bsp", "staleness": 0, "local_steps": 1, "optimizer": "", "lr": 0.0,
            "momentum": 0.0, "weight_decay": 0.0}

    def register(self, name, shape_or_array, kind="parameters", own_clock=False, codec="",
                 pull_codec="", memory="host", staging_buffers=False):
        if kind != "average":
            raise _bad("a single-process job (no shards) has no parameters on shards: use the "
                       "default update of DistributedOptimizer, or run under harrier-launch")

    def push_pull_async(self, name, gradient, out):
        if isinstance(out, _torch.Tensor):
            with _torch.no_grad():
                out.copy_(gradient.reshape(out.shape))
        else:
            out[...] = _np.asarray(gradient, dtype=_np.float32).reshape(out.shape)
        return _Done(out)

    def __init__(self):
        self._tables = {}  # sparse table name -> _LocalTable

    # Sparse tables held in this process, with the shards' arithmetic
    # (harrier/sparse_rows.py); the push count is the table's clock.
    def register_sparse(self, name, dim, **options):
        if not isinstance(dim, int) or not 1 <= dim <= 1 << 16:
            raise _bad(f"sparse table '{name}': dim must be an int in [1, 65536], got {dim!r}")
        if name in self._tables:
            raise _harrier.AlreadyExistsError(
                f"sparse table '{name}' is already registered by this worker", "ALREADY_EXISTS", 6)
        try:
            self._tables[name] = _LocalTable(_sparse_rows.SparseRows(name, dim, **options))
        except ValueError as e:
            raise _bad(str(e)) from None

    def _table(self, name):
        try:
            return self._tables[name]
        except KeyError:
            raise _harrier.NotFoundError(f"sparse table '{name}' is not registered",
                                         "NOT_FOUND", 5) from None

    def sparse_dim(self, name):
        return self._table(name).rows.dim

    def tensor_clock(self, name):
        return self._table(name).clock

    def pull_rows(self, name, ids, out=None):
        table = self._table(name)
        ids = _harrier._ids(ids, f"pull_rows '{name}' ids").reshape(-1)
        distinct, inverse = _np.unique(ids, return_inverse=True)
        values = table.rows.pull(distinct)[inverse]
        table.stats["ids_requested"] += len(ids)
        table.stats["rows_pulled"] += len(distinct)
        if out is None:
            return values
        view = _harrier._writable(out, f"pull_rows '{name}' out")
        if view.size != values.size:
            raise _bad(f"pull_rows '{name}': out has {view.size} elements, {len(ids)} ids need "
                       f"{values.size} (shape {values.shape})")
        view.reshape(values.shape)[...] = values
        return out

    def push_rows(self, name, ids, gradients):
        table = self._table(name)
        dim = table.rows.dim
        ids = _harrier._ids(ids, f"push_rows '{name}' ids").reshape(-1)
        grads = _harrier._readable(gradients, f"push_rows '{name}' gradients")
        if grads.size != ids.size * dim:
            raise _bad(f"push_rows '{name}': gradients have {grads.size} elements, {ids.size} "
                       f"ids need {ids.size * dim} (shape ({ids.size}, {dim}))")
        distinct, inverse = _np.unique(ids, return_inverse=True)
        grads = grads.reshape(len(ids), dim)
        if len(distinct) == len(ids):  # what Embedding pushes
            summed = _np.empty_like(grads)
            summed[inverse] = grads
        else:  # a repeated id's gradients summed in order, as the client does
            summed = _np.zeros((len(distinct), dim), _np.float32)
            _np.add.at(summed, inverse, grads)
        table.rows.push(distinct, summed)
        table.clock += 1
        table.stats["rows_pushed"] += len(distinct)

    def pull_rows_async(self, name, ids, out=None):
        return _Done(self.pull_rows(name, ids, out))

    def push_rows_async(self, name, ids, gradients):
        self.push_rows(name, ids, gradients)
        return _Done(None)

    def pull_rows_many_async(self, tables):
        tables = dict(tables)
        for name in tables:
            self._table(name)
        return _Done({name: self.pull_rows(name, ids) for name, ids in tables.items()})

    def push_rows_many_async(self, tables):
        tables = dict(tables)
        for name, (ids, gradients) in tables.items():  # all checked before any is pushed
            dim = self._table(name).rows.dim
            ids = _harrier._ids(ids, f"push_rows_many '{name}' ids").reshape(-1)
            grads = _harrier._readable(gradients, f"push_rows_many '{name}' gradients")
            if grads.size != ids.size * dim:
                raise _bad(f"push_rows_many '{name}': gradients have {grads.size} elements, "
                           f"{ids.size} ids need {ids.size * dim}")
        for name, (ids, gradients) in tables.items():
            self.push_rows(name, ids, gradients)
        return _Done(None)

    def sparse_stats(self, name):
        return dict(self._table(name).stats)

    def barrier(self, name):
        pass

    def leave(self):
        pass

    def close(self):
        pass


_job = None
_job_lock = _threading.Lock()


def _environment_servers():
    servers = _os.environ.get("HARRIER_SERVERS", "")
    if servers:
        return servers
    # The Kubernetes manifests' way (deploy/k8s): shard i is at
    # SERVER_PREFIX i SERVER_SUFFIX.
    prefix, suffix = _os.environ.get("SERVER_PREFIX"), _os.environ.get("SERVER_SUFFIX")
    shards = _os.environ.get("HARRIER_NUM_SHARDS", "")
    if prefix and suffix and shards.isdigit():
        return ",".join(f"{prefix}{i}{suffix}" for i in range(int(shards)))
    return ""


def _environment_int(names, default=None):
    for name in names:
        value = _os.environ.get(name, "")
        if value != "":
            try:
                return int(value)
            except ValueError:
                raise _bad(f"{name}={value!r} is not an integer") from None
    return default


def init(servers=None, rank=None, local_rank=None, local_size=None, **client_options):
    """Joins the job, from arguments or from the environment harrier-launch
    (and deploy/k8s) sets: HARRIER_SERVERS (every shard's host:port, shard 0
    first; or SERVER_PREFIX, SERVER_SUFFIX and HARRIER_NUM_SHARDS),
    HARRIER_RANK (or JOB_COMPLETION_INDEX; neither: the shards pick the
    lowest free rank), HARRIER_LOCAL_RANK, HARRIER_LOCAL_SIZE,
    HARRIER_NUM_WORKERS (checked against the shards'), HARRIER_TLS_CA,
    HARRIER_TLS_CERT, HARRIER_TLS_KEY, HARRIER_AUTH_TOKEN_FILE, HARRIER_JOB
    and HARRIER_TRANSPORT. HARRIER_TIMELINE (read by harrier.Client) or
    Horovod's HOROVOD_TIMELINE starts a timeline at once (start_timeline()).
    client_options go to harrier.Client (codec, rpc_timeout, ...). A second
    call does nothing. The job is left at exit (shutdown())."""
    global _job, _default_client
    with _job_lock:
        if _job is not None:
            return
        servers = servers if servers is not None else _environment_servers()
        if not servers:
            expected = _environment_int(["HARRIER_NUM_WORKERS"], 1)
            if expected != 1 or rank not in (None, 0):
                raise _bad("harrier.torch.init(): no shards given for a job of "
                           f"{expected} workers. Run the script under harrier-launch "
                           "(harrier-launch -np 2 -- python3 train.py), set HARRIER_SERVERS="
                           "host:port,... (shard 0 first), or pass servers=")
            print("harrier.torch: no shards (HARRIER_SERVERS is not set): running as a single "
                  "process, size() == 1; run under harrier-launch to train with many",
                  file=_sys.stderr)
            _job = _Job(_LocalClient(), 0, 1)
            return
        if rank is None:
            rank = _environment_int(["HARRIER_RANK", "JOB_COMPLETION_INDEX"])
        local_rank = local_rank if local_rank is not None else _environment_int(
            ["HARRIER_LOCAL_RANK"], 0)
        local_size = local_size if local_size is not None else _environment_int(
            ["HARRIER_LOCAL_SIZE"], 1)
        options = dict(client_options)
        for option, variable in (("tls_ca_file", "HARRIER_TLS_CA"),
                                 ("tls_cert_file", "HARRIER_TLS_CERT"),
                                 ("tls_key_file", "HARRIER_TLS_KEY"),
                                 ("job", "HARRIER_JOB"), ("transport", "HARRIER_TRANSPORT")):
            if option not in options and _os.environ.get(variable):
                options[option] = _os.environ[variable]
        token_file = _os.environ.get("HARRIER_AUTH_TOKEN_FILE", "")
        if "auth_token" not in options and token_file:
            options["auth_token"] = _native.read_job_token_file(token_file).decode()
        client = _harrier.Client(servers=servers, rank=rank, **options)
        expected = _environment_int(["HARRIER_NUM_WORKERS"])
        if expected is not None and expected != client.num_workers:
            client.close()
            raise _bad(f"HARRIER_NUM_WORKERS={expected}, but the shards run --num_workers="
                       f"{client.num_workers}")
        _job = _Job(client, local_rank, local_size)
        _default_client = client
        _atexit.register(shutdown)
        # harrier.Client started HARRIER_TIMELINE's; Horovod's name too.
        if not _os.environ.get("HARRIER_TIMELINE") and _os.environ.get("HOROVOD_TIMELINE"):
            _harrier._start_timeline(client, _os.environ["HOROVOD_TIMELINE"], from_environment=True)


_timeline_path = _harrier._timeline_path


def start_timeline(file_path, mark_cycles=False):
    """Records this worker's pushes, pulls and the waits on them (and, with
    techniques=, the comm scheduler's calls, waits and steps) to
    `file_path`, a Chrome trace: open it in ui.perfetto.dev or
    chrome://tracing. "{rank}" in the path is replaced by the worker's rank;
    without it only rank 0 writes one, as in Horovod. mark_cycles is
    accepted for Horovod's signature and has no effect (Harrier has no
    negotiation cycles). HARRIER_TIMELINE=path does the same from init()."""
    del mark_cycles
    job = _need_job("start_timeline()")
    if isinstance(job.client, _LocalClient):
        print("harrier.torch: a single process without shards has no calls to record: no "
              "timeline", file=_sys.stderr)
        return
    _harrier._start_timeline(job.client, file_path)


def stop_timeline():
    """Ends the timeline's file (also done by shutdown() and at exit); calls
    still in flight are left out."""
    job = _need_job("stop_timeline()")
    if not isinstance(job.client, _LocalClient):
        job.client.stop_timeline()


def _need_job(what):
    if _job is None:
        raise _bad(f"{what}: call harrier.torch.init() first")
    return _job


def is_initialized():
    return _job is not None


def size():
    """Workers in the job (the shards' --num_workers)."""
    return _need_job("size()").client.num_workers


def rank():
    return _need_job("rank()").client.rank


def local_rank():
    """This worker's index among the workers on its host (HARRIER_LOCAL_RANK)."""
    return _need_job("local_rank()").local_rank


def local_size():
    """Workers on this host (HARRIER_LOCAL_SIZE)."""
    return _need_job("local_size()").local_size


def shutdown():
    """Finishes every DistributedOptimizer's calls in flight, leaves the job
    (no round waits for this worker any more) and closes the client. Runs
    by itself at exit; calling it earlier is fine, and a second call does
    nothing."""
    global _job, _default_client
    with _job_lock:
        job, _job = _job, None
    if job is None:
        return
    if _default_client is job.client:
        _default_client = None
    try:
        for optimizer in list(job.optimizers):
            optimizer.finish()
        job.finish_sparse()
        if not job.left:
            job.client.leave()
    except _harrier.Error as e:
        print(f"harrier.torch: leaving the job: {e}", file=_sys.stderr)
    finally:
        job.client.close()


def join():
    """This worker has no more batches: from now on no round of any tensor
    waits for it (the others average over the workers still training), as
    Horovod's join() lets ranks with uneven data finish. Blocks until every
    worker has joined. Returns this worker's rank."""
    job = _need_job("join()")
    for optimizer in list(job.optimizers):
        optimizer.finish()
    job.finish_sparse()
    if not job.left:
        job.client.leave()
        job.left = True
    job.client.barrier("harrier.join")
    return job.client.rank


# What Horovod scripts ask about their build (e.g. `if hvd.nccl_built():`).
def nccl_built():
    return False


def mpi_built():
    return False


def gloo_built():
    return False


def mpi_threads_supported():
    return False


def cuda_built():
    """True where this module was built with --config=cuda."""
    return bool(_native.built_with_cuda)


def barrier(name="harrier.barrier"):
    """Blocks until every worker has entered the barrier of this name."""
    _need_job("barrier()").client.barrier(name)


# -- collectives --------------------------------------------------------------

def _reduction(average, op):
    if average is not None:
        if op is not None:
            raise _bad("give op= or the older average=, not both")
        op = Average if average else Sum
    op = Average if op is None else op
    if op == Adasum:
        raise _bad("op=Adasum is not supported: use Average (the default) or Sum")
    if op not in (Average, Sum):
        raise _bad(f"op must be harrier.torch.Average or Sum, got {op!r}")
    return op


class _Pending:
    """An allreduce in flight (allreduce_async's handle)."""

    def __init__(self, job, key, handle, sent, out, tensor, op, postscale, inplace):
        self.job, self.key, self.handle = job, key, handle
        self.sent, self.out = sent, out  # kept alive while the call runs
        self.tensor, self.op, self.postscale, self.inplace = tensor, op, postscale, inplace
        self.result = None

    def wait(self, timeout=None):
        if self.result is not None:
            return self.result
        try:
            self.handle.wait(timeout)
        except _harrier.DeadlineExceededError as e:
            raise _harrier.DeadlineExceededError(
                f"{self.key}: not every worker pushed it in time; a rank that never calls it "
                f"(or left the job) leaves the others waiting: {e.message}",
                e.code, e.code_value) from None
        values = (self.out if isinstance(self.out, _torch.Tensor)
                  else _torch.from_numpy(self.out)).reshape(self.tensor.shape)
        scale = self.postscale * (self.job.client.num_workers if self.op == Sum else 1.0)
        if scale != 1.0:
            values = values * scale
        values = values.to(self.tensor.dtype) if self.tensor.is_floating_point() else (
            values.round().to(self.tensor.dtype))
        if self.inplace:
            with _torch.no_grad():
                self.tensor.copy_(values)
            self.result = self.tensor
        else:
            self.result = values
        return self.result


def allreduce_async(tensor, average=None, name=None, compression=Compression.none, op=None,
                    prescale_factor=1.0, postscale_factor=1.0, pull_compression="paired",
                    _inplace=False):
    """Starts an allreduce of `tensor` over every worker; returns a handle
    for synchronize(). Any tensor, at any time, under any name: each name is
    a tensor of its own on the shards with a clock of its own, so a name
    used once an epoch (or never again) waits for nothing else. Every
    worker calls it the same number of times per name (unnamed calls are
    named by their order). op: Average (default) or Sum; integer tensors
    are reduced in float32 and rounded. pull_compression: how the average
    comes back, "paired" (default: the pull codec that goes with
    `compression`), Compression.none (dense) or any Compression value, as
    DistributedOptimizer's."""
    job = _need_job("allreduce")
    _check_device(tensor, "allreduce")
    op = _reduction(average, op)
    codec = _codec_of(compression)
    pull_codec = _codec_of(pull_compression)
    key = job.collective_name("allreduce", name)
    sent = tensor.detach().reshape(-1).to(_torch.float32)
    if prescale_factor != 1.0:
        sent = sent * float(prescale_factor)
    if sent.is_cuda:  # stays on the device, compressed there
        sent = sent.contiguous()
        job.ensure_average(key, sent.numel(), codec, "device", pull_codec)
        out = _torch.empty_like(sent)
    else:
        sent = _np.ascontiguousarray(sent.numpy(), dtype=_np.float32)
        job.ensure_average(key, sent.size, codec, "host", pull_codec)
        out = _np.empty(sent.size, dtype=_np.float32)
    handle = job.client.push_pull_async(key, sent, out)
    return _Pending(job, key, handle, sent, out, tensor, op, float(postscale_factor), _inplace)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0):
    """allreduce_async that writes the result into `tensor`."""
    return allreduce_async(tensor, average, name, Compression.none, op, prescale_factor,
                           postscale_factor, _inplace=True)


def synchronize(handle, timeout=None):
    """Waits for an allreduce_async or broadcast_async; returns its tensor."""
    return handle.wait(timeout)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, pull_compression="paired"):
    """The average (or sum) of `tensor` over every worker, as a new tensor
    (pull_compression: as allreduce_async's)."""
    return synchronize(allreduce_async(tensor, average, name, compression, op, prescale_factor,
                                       postscale_factor, pull_compression))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0):
    """allreduce into `tensor` itself."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def push_pull_async(tensor, average=True, name=None, version=0, priority=0,
                    compression=Compression.none):
    """BytePS's name for allreduce_async (version and priority are accepted
    and not used)."""
    return allreduce_async(tensor, average=average, name=name, compression=compression)


def push_pull(tensor, average=True, name=None, version=0, priority=0,
              compression=Compression.none):
    """BytePS's name for allreduce."""
    return synchronize(push_pull_async(tensor, average, name, version, priority, compression))


def _broadcast_arrays(client, arrays, root_rank, tag):
    """Every worker's float32 arrays get root_rank's values, exactly. Each
    call adds its tensors to the shards (one name each)."""
    if not 0 <= root_rank < client.num_workers:
        raise _bad(f"root_rank {root_rank} is not in [0, {client.num_workers})")
    if isinstance(client, _LocalClient):
        return  # one worker: it is the root
    round_ = getattr(client, "_broadcasts", 0)
    client._broadcasts = round_ + 1
    prefix = f"harrier.broadcast/{round_}/{tag}"
    # On clocks of their own (never pushed): a pull at clock 0 is answered
    # at once, however far training has gone.
    if client.rank == root_rank:
        for name, array in arrays:
            client.register(prefix + name, array.reshape(-1), own_clock=True)
    client.barrier(prefix + "registered")
    if client.rank != root_rank:
        for name, array in arrays:
            client.register(prefix + name, (array.size,), own_clock=True)
            client.pull(prefix + name, array.reshape(-1))


def broadcast_async(tensor, root_rank, name=None):
    """broadcast, as a handle for synchronize() (it completes at once)."""
    return _Done(broadcast(tensor, root_rank, name))


def broadcast_async_(tensor, root_rank, name=None):
    return _Done(broadcast_(tensor, root_rank, name))


def broadcast(tensor, root_rank, name=None):
    """root_rank's `tensor`, as a new tensor on every worker."""
    result = tensor.detach().clone()
    return broadcast_(result, root_rank, name)


def broadcast_(tensor, root_rank, name=None):
    """Writes root_rank's values into `tensor` on every worker. Values go
    through the shards as float32 (integers exact below 2**24)."""
    job = _need_job("broadcast")
    _check_device(tensor, "broadcast", staged=True)
    staged = _np.ascontiguousarray(tensor.detach().reshape(-1).to(_torch.float32).cpu().numpy())
    _broadcast_arrays(job.client, [(name or "tensor", staged)], root_rank, "")
    with _torch.no_grad():
        tensor.copy_(_torch.from_numpy(staged).reshape(tensor.shape).to(tensor.dtype))
    return tensor


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's picklable object on every worker (returned)."""
    job = _need_job("broadcast_object")
    client = job.client
    tag = (name or "object") + "/"
    length = _np.zeros(2, dtype=_np.float32)
    payload = b""
    if client.rank == root_rank:
        payload = _pickle.dumps(obj)
        # Two bytes per float32 element: every value exact, none NaN.
        length[0], length[1] = len(payload) % 65536, len(payload) // 65536
    _broadcast_arrays(client, [("length", length)], root_rank, tag)
    size_ = int(length[0]) + 65536 * int(length[1])
    padded = payload + b"\0" * (size_ % 2)
    words = (_np.frombuffer(padded, dtype="<u2").astype(_np.float32) if client.rank == root_rank
             else _np.zeros((size_ + 1) // 2, dtype=_np.float32))
    if size_ > 0:
        _broadcast_arrays(client, [("bytes", words)], root_rank, tag)
    if client.rank == root_rank:
        return obj
    data = words.astype("<u2").tobytes()[:size_]
    return _pickle.loads(data)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """Every worker's optimizer gets root_rank's state and hyper-parameters
    (its state_dict: momentum buffers, step counts, each group's lr)."""
    job = _need_job("broadcast_optimizer_state")
    inner = getattr(optimizer, "optimizer", optimizer)
    mine = job.client.rank == root_rank
    state = broadcast_object(inner.state_dict() if mine else None, root_rank,
                             name="optimizer_state")
    if not mine:
        inner.load_state_dict(state)


def _fused_groups(params, order, codec, fusion_bytes, default_bytes):
    """The indices of `params`, taken in `order`, in groups of consecutive
    parameters of up to fusion_bytes float32 bytes (0: default_bytes; -1:
    one parameter each), never across devices. Codecs that need a layer's
    shape (PowerSGD) or keep per-element state of their own choosing get
    one parameter per group."""
    fuse = fusion_bytes >= 0 and codec.split(":")[0] in ("none", "fp16", "bf16")
    limit = fusion_bytes or default_bytes
    groups, current, size = [], [], 0
    for i in order:
        bytes_ = 4 * params[i].numel()
        if current and (not fuse or size + bytes_ > limit or
                        params[i].device != params[current[0]].device):
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += bytes_
    if current:
        groups.append(current)
    return groups


class DistributedOptimizer(_torch.optim.Optimizer):
    """Wraps `optimizer` so that step() trains through the parameter servers.
    It is a torch.optim.Optimizer sharing the wrapped one's param_groups and
    state, so learning-rate schedulers take it as they take the original.

    Horovod's arguments: named_parameters ((name, parameter) pairs, front of
    the model first, the same names on every worker; None: the optimizer's
    parameters, named by position), compression (Compression.none, .fp16,
    .topk(0.01), ...: the codec of the gradient pushes, and by default of
    the averages pulled back, as Horovod's compresses both), op (Average or
    Sum), gradient_predivide_factor (gradients divided by f before the
    average and multiplied by f after: the same average, another rounding),
    backward_passes_per_step (backward() calls accumulated per step()).

    pull_compression (update="average"): "paired" (default: the pull codec
    that goes with `compression`, fp16 with fp16, top-k with a top-k of its
    ratio, PowerSGD with PowerSGD), Compression.none (dense pulls) or any
    Compression value.
    update: "average", "server", "worker" or "auto" (module docstring).
    fusion_bytes (update="average"): gradients travel in buckets of up to
    this many bytes (0: 4 MiB; -1: one parameter each); (update="worker")
    the model's changes travel in groups of consecutive parameters of up to
    this many bytes (0: 64 MiB; -1: one parameter each), each a tensor on
    the shards named after its first parameter ("name+N" for N more).
    client: a harrier.Client; None: the init() job's, or a new one from
    `servers`, `rank`, `codec`, `pull_codec`, `transport` and
    **client_options (the older API, whose "auto" is "server").
    sync: None or the mode this code expects ("bsp", "ssp", "asp",
    "local"): a mismatch with the shards' --sync is an error.
    techniques (update="server"): None (each gradient pushed from its hook,
    the parameters pulled in step()) or comm scheduler techniques ("all",
    "wfbp+fusion", ...). model: with a scheduler, the module whose forward
    pre-hooks wait for each layer's parameters; call synchronize() to have
    every parameter current. forward_order_tail (with "priority" or "all"
    under BSP with several workers): the share of a step's push bytes, the
    front of the model, sent last and front first, so the next forward
    starts before the whole backlog is back; about 1 - backward time /
    communication time, the same on every worker (0: off); "measure" (the
    default): the workers time their second step and agree the tail
    through the shards, planned from the third (every worker must say
    "measure"); stats()["scheduler"] gives the tail planned.
    """

    def __init__(self, optimizer, named_parameters=None, compression=None,
                 backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                 client=None, servers=None, rank=None, codec="none", pull_codec="none",
                 transport="auto", sync=None, update="auto", techniques=None, model=None,
                 prefix="", fusion_bytes=0, partition_bytes=0, max_inflight_bytes=0,
                 wait_timeout=120.0, pull_compression="paired", forward_order_tail="measure",
                 **client_options):
        global _default_client
        from_job = client is None and servers is None
        if from_job:
            if _job is None:
                raise _bad("DistributedOptimizer: call harrier.torch.init() first (or pass "
                           "client= or servers=)")
            client = _job.client
        elif client is None:
            client = _harrier.Client(servers=servers, rank=rank, codec=codec,
                                     pull_codec=pull_codec, transport=transport, **client_options)
        elif servers is not None or codec != "none" or pull_codec != "none" or client_options:
            raise _bad("codec, pull_codec, servers and client options belong to the Client; "
                       "pass them to harrier.Client, or pass no client=")
        self._client = client
        if _default_client is None:
            _default_client = client
        self._optimizer = optimizer
        self._sync = client.sync
        mode = self._sync["mode"]
        if sync is not None and sync != mode:
            raise _bad(f"sync={sync!r} was asked for, but the shards run {mode!r} "
                       "(their --sync flag decides)")
        asked = update
        if update == "auto":
            update = "worker" if mode == "local" else ("average" if from_job else "server")
        if update not in ("average", "server", "worker"):
            raise _bad(f"update must be 'average', 'server', 'worker' or 'auto', got {update!r}")
        if update in ("server", "average") and mode == "local":
            raise _bad(f"local SGD updates on the worker: use update='worker' (or 'auto'), "
                       f"not {update!r}")
        if update != "server" and techniques is not None:
            raise _bad("the comm scheduler (techniques=) pushes gradients for the shards' "
                       "optimizer: it needs update='server'")
        if int(backward_passes_per_step) < 1:
            raise _bad("backward_passes_per_step must be >= 1")
        self._op = _reduction(None, op)
        self._predivide = float(gradient_predivide_factor)
        if not self._predivide > 0:
            raise _bad("gradient_predivide_factor must be > 0")
        self._compression = _codec_of(compression)
        self._pull_compression = _codec_of(pull_compression)
        if update != "average" and pull_compression != "paired":
            raise _bad("pull_compression= compresses the averages pulled back (update='average'); "
                       "with update='server' or 'worker' the Client's pull_codec does")
        if update == "average":
            if self._compression.split(":")[0] in _VOTE_CODECS:
                raise _bad(f"compression {self._compression!r} votes on signs; its rounds have no "
                           "average gradient for your optimizer: use update='server'")
        elif compression is not None and self._compression != "none":
            raise _bad("compression= compresses the averaged gradients (update='average'); "
                       "with update='server' or 'worker' the Client's codec does")
        if update != "average" and (self._op != Average or self._predivide != 1.0):
            raise _bad("op and gradient_predivide_factor apply to update='average'")
        if asked == "server":
            self._check_shard_optimizer(optimizer)
        if update == "worker" and mode != "local":
            shard = self._sync.get("optimizer", "")
            if shard and (shard != "sgd" or not _math.isclose(self._sync["lr"], 1.0)):
                raise _bad(f"update='worker' pushes parameter changes, which the shards must "
                           f"subtract as they are: start them with --optimizer=sgd --lr=1 "
                           f"(they run --optimizer={shard} --lr={self._sync['lr']:g})")
        self._update = update
        self._local_steps = max(1, int(self._sync["local_steps"])) if mode == "local" else 1
        self._passes_per_step = int(backward_passes_per_step)

        if named_parameters is None:
            named_parameters = [(f"param.{g}.{i}", p)
                                for g, group in enumerate(optimizer.param_groups)
                                for i, p in enumerate(group["params"])]
        self._names, self._params = [], []
        seen = set()
        for name, param in named_parameters:
            if not param.requires_grad:
                continue
            if name in seen:
                raise _bad(f"parameter name {name!r} appears twice")
            _check_device(param, f"parameter {name!r}", cuda=(update == "average"))
            if update == "average":
                # Gradients are averaged in float32 and handed back in the
                # parameter's own dtype (float64, float16, bfloat16).
                if not param.is_floating_point():
                    raise _bad(f"parameter {name!r}: {param.dtype} is not a floating type")
            elif param.dtype != _torch.float32:
                raise _bad(f"parameter {name!r}: {param.dtype}; update={update!r} trains "
                           "float32 parameters (the default update takes any floating type)")
            if not param.is_contiguous():
                raise _bad(f"parameter {name!r} is not contiguous")
            seen.add(name)
            self._names.append(prefix + name)
            self._params.append(param)
        if not self._params:
            raise _bad("no parameters that require gradients")
        self._passes = [0] * len(self._params)
        self._handed = [False] * len(self._params)
        self._handles = [None] * len(self._params)
        self._current = [techniques is None] * len(self._params)
        self._steps = 0
        self._scheduler = None
        self._hooks = []
        self._synchronized = False
        self._skip_synchronize = False
        self._forward_hooked = model is not None and techniques is not None
        if _job is not None and client is _job.client:
            _job.optimizers.add(self)

        if update == "average":
            self._make_buckets(int(fusion_bytes))  # the gradients live in the buckets
            self._install_gradient_hooks()
            return

        # Without the scheduler, a gradient is pushed from p.grad itself
        # (step() waits for the push before zero_grad can touch it) and the
        # parameters are pulled straight into the model: its hook runs once
        # autograd is done with the parameter for this backward pass. The
        # scheduler keeps pushes and pulls in flight across step(), when
        # zero_grad and the next forward may touch p.grad and p, so it gets
        # arrays of its own. update='worker' keeps flat arrays per group of
        # parameters instead (_make_model_groups).
        staged = techniques is not None
        self._grads = [_np.zeros(p.shape, dtype=_np.float32) if staged else None
                       for p in self._params]
        self._pulled = [_np.zeros(p.shape, dtype=_np.float32) if techniques is not None
                        else None for p in self._params]
        self._pushed_grads = [None] * len(self._params)  # kept alive while pushed

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
                fusion_bytes, partition_bytes, max_inflight_bytes, wait_timeout,
                forward_order_tail=forward_order_tail)
        elif update == "worker":
            self._make_model_groups(int(fusion_bytes))
            for name, start in zip(self._group_names, self._group_start):
                client.register(name, start)
        else:
            for name, param in zip(self._names, self._params):
                client.register(name, _numpy_view(param))
        if client.rank == 0:
            client.barrier(barrier)
        if techniques is not None:
            for i in range(len(self._params)):
                self._make_current(i)
        elif update == "worker":
            self._pull_model()  # rank 0's values
        else:
            for name, param in zip(self._names, self._params):
                client.pull(name, _numpy_view(param))  # rank 0's values
        if update != "worker":
            self._install_gradient_hooks()
        if model is not None and self._scheduler is not None:
            self._install_forward_hooks(model)

    def _make_model_groups(self, fusion_bytes):
        """update='worker': the model's change travels in groups of
        consecutive parameters of up to fusion_bytes (0: 64 MiB; -1: one
        parameter each), each one flat tensor on the shards, as DDP's model
        averager flattens the model into one all-reduce: a small model's
        average is a call per shard, not one per parameter. Codecs that need
        a layer's shape (PowerSGD) or keep per-element state of their own
        choosing get one parameter per group. Each group keeps the model as
        of the last average (the start of the round, where the pull lands)
        and the change pushed."""
        groups = _fused_groups(self._params, range(len(self._params)),
                               self._client.codec or "none", fusion_bytes, 64 << 20)
        self._groups = groups
        self._group_names, self._group_start, self._group_delta = [], [], []
        self._group_offsets = []
        for k, members in enumerate(groups):
            offsets, offset = [], 0
            for i in members:
                offsets.append(offset)
                offset += self._params[i].numel()
            self._group_offsets.append(offsets)
            if len(members) == 1:  # the parameter's own name and shape
                name, shape = self._names[members[0]], tuple(self._params[members[0]].shape)
            else:  # the same on every worker: the same parameters, in the same order
                name, shape = f"{self._names[members[0]]}+{len(members) - 1}", (offset,)
            self._group_names.append(name)
            self._group_start.append(_np.empty(shape, dtype=_np.float32))
            self._group_delta.append(_np.empty(shape, dtype=_np.float32))
            for param, start, _ in self._group_views(k):
                start[...] = param

    def _group_views(self, k):
        """(parameter as a flat array, its slice of group k's start, of its
        change) for each parameter of group k."""
        start, delta = self._group_start[k].reshape(-1), self._group_delta[k].reshape(-1)
        for i, at in zip(self._groups[k], self._group_offsets[k]):
            n = self._params[i].numel()
            yield _numpy_view(self._params[i]).reshape(-1), start[at:at + n], delta[at:at + n]

    def _pull_model(self):
        """update='worker': pulls every group into its start and the model."""
        for name, start in zip(self._group_names, self._group_start):
            self._client.pull(name, start)
        self._model_from_groups()

    def _model_from_groups(self):
        for k in range(len(self._groups)):
            for param, start, _ in self._group_views(k):
                param[...] = start

    def _make_buckets(self, fusion_bytes):
        """update='average': the gradients travel in buckets, filled in
        backward order (the last parameter's gradient is ready first) up to
        fusion_bytes (0: 4 MiB; -1: one parameter each), one push-pull per
        bucket once its last gradient is in, as DDP's buckets and Horovod's
        fusion buffer do: a small model's step is one call, not one per
        parameter. Codecs that need a layer's shape (PowerSGD) or keep
        per-element state of their own choosing get one parameter per
        bucket. Each bucket is an average tensor on the shards with a
        clock of its own; its buffers are where the parameters are (CUDA
        ones stay on the device).

        A bucket of float32 parameters has two buffers that trade places
        each step, as DDP's gradient_as_bucket_view keeps gradients in its
        buckets: the averaged gradients are handed back as views of the one
        pulled into (param.grad points there, no copy), and the next
        backward accumulates into those views, which are then the next
        push. Only a gradient autograd allocated afresh (after
        zero_grad(set_to_none=True)) is copied in."""
        buckets = _fused_groups(self._params, reversed(range(len(self._params))),
                                self._compression, fusion_bytes, 4 << 20)
        self._buckets = buckets
        self._bucket_of = [0] * len(self._params)
        self._offset = [0] * len(self._params)
        self._bucket_grads, self._bucket_pulled, self._bucket_names = [], [], []
        self._bucket_in_place = []
        for k, members in enumerate(buckets):
            offset = 0
            for i in members:
                self._bucket_of[i], self._offset[i] = k, offset
                offset += self._params[i].numel()
            device = self._params[members[0]].device
            self._bucket_grads.append(_torch.zeros(offset, dtype=_torch.float32, device=device))
            self._bucket_pulled.append(_torch.zeros(offset, dtype=_torch.float32, device=device))
            if len(members) == 1:
                name, shape = f"harrier.gradient/{self._names[members[0]]}", tuple(
                    self._params[members[0]].shape)
            else:  # the same on every worker: the same parameters, in the same order
                name, shape = (f"harrier.gradient/{self._names[members[0]]}+{len(members) - 1}",
                               (offset,))
            self._bucket_names.append(name)
            self._bucket_in_place.append(
                all(self._params[i].dtype == _torch.float32 for i in members))
            # Both buckets are staging: the gradients' is written by backward
            # just before its push and not again until step() has waited for
            # it, the pulled one is read only after a pull that succeeded.
            self._client.register(name, shape, kind="average", codec=self._compression,
                                  pull_codec=self._pull_compression,
                                  memory="device" if device.type == "cuda" else "host",
                                  staging_buffers=True)
        self._bucket_filled = [0] * len(buckets)
        self._handles = [None] * len(buckets)

    def _bucket_view(self, buffers, i):
        k, offset, param = self._bucket_of[i], self._offset[i], self._params[i]
        return buffers[k][offset:offset + param.numel()].view(param.shape)

    def _check_shard_optimizer(self, optimizer):
        """update='server' runs the shards' optimizer instead of this one:
        refuse settings that say otherwise, where they can be compared."""
        shard = self._sync.get("optimizer", "")
        if not shard:
            return  # shards that do not say
        groups = optimizer.param_groups
        said = (f"--optimizer={shard} --lr={self._sync['lr']:g}"
                f"{' --momentum=%g' % self._sync['momentum'] if shard in ('momentum', 'nesterov') else ''}"
                f"{' --weight_decay=%g' % self._sync['weight_decay'] if self._sync['weight_decay'] else ''}")
        lrs = {float(g["lr"]) for g in groups if "lr" in g}
        problems = []
        if len(lrs) > 1:
            problems.append(f"{len(lrs)} learning rates in its param groups (the shards have one)")
        if isinstance(optimizer, _torch.optim.SGD):
            momentum = float(groups[0].get("momentum", 0.0))
            nesterov = bool(groups[0].get("nesterov", False))
            kind = "sgd" if momentum == 0 else ("nesterov" if nesterov else "momentum")
            if kind != shard:
                problems.append(f"it is {kind}")
            elif kind != "sgd" and not _math.isclose(momentum, self._sync["momentum"],
                                                     rel_tol=1e-6):
                problems.append(f"its momentum is {momentum:g}")
        elif isinstance(optimizer, _torch.optim.Adam):
            if shard != "adam":
                problems.append("it is adam")
        elif isinstance(optimizer, _torch.optim.Adagrad):
            if shard != "adagrad":
                problems.append("it is adagrad")
        else:
            return  # another kind: nothing to compare
        if len(lrs) == 1 and not _math.isclose(lrs.pop(), self._sync["lr"], rel_tol=1e-6):
            problems.append(f"its lr is {float(groups[0]['lr']):g}")
        decay = float(groups[0].get("weight_decay", 0.0))
        if not _math.isclose(decay, self._sync["weight_decay"], rel_tol=1e-6, abs_tol=1e-12):
            problems.append(f"its weight_decay is {decay:g}")
        if problems:
            raise _bad(f"update='server' applies the shards' optimizer ({said}) instead of "
                       f"{type(optimizer).__name__}, but {', '.join(problems)}: start the shards "
                       "with matching flags, or leave update to its default (your optimizer on "
                       "the averaged gradients)")

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
            elif self._passes[i] > self._passes_per_step:
                # Its gradient has gone already: this pass would be lost.
                raise _bad(f"parameter {self._names[i]!r}: gradients computed "
                           f"{self._passes[i]} times before step(), more than "
                           f"backward_passes_per_step={self._passes_per_step}; raise it, or call "
                           "step() after each backward()")
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
        if self._update == "average":
            staged = self._bucket_view(self._bucket_grads, i)
            with _torch.no_grad():
                if param.grad is None:
                    staged.zero_()  # unused this step: the round still needs a push
                elif not _same_memory(param.grad, staged):
                    staged.copy_(param.grad)
                if self._predivide != 1.0:
                    staged.div_(self._predivide)
            self._handed[i] = True
            k = self._bucket_of[i]
            self._bucket_filled[k] += 1
            if self._bucket_filled[k] == len(self._buckets[k]):
                self._handles[k] = self._client.push_pull_async(
                    self._bucket_names[k], self._bucket_grads[k], self._bucket_pulled[k])
            return
        if self._scheduler is not None:
            if param.grad is None:
                self._grads[i].fill(0.0)  # unused this step: the round still needs a push
            else:
                self._grads[i][...] = _numpy_view(param.grad.to(_torch.float32))
            self._handed[i] = True
            self._scheduler.gradient_ready(i, self._grads[i])
            return
        grad = param.grad
        if grad is None or grad.dtype != _torch.float32 or not grad.is_contiguous():
            if self._grads[i] is None:
                self._grads[i] = _np.zeros(param.shape, dtype=_np.float32)
            if grad is None:
                self._grads[i].fill(0.0)  # unused this step: the round still needs a push
            else:
                self._grads[i][...] = _numpy_view(grad.to(_torch.float32))
            gradient = self._grads[i]
        else:
            self._pushed_grads[i] = grad
            gradient = _numpy_view(grad)
        self._handed[i] = True
        self._handles[i] = self._client.push_pull_async(self._names[i], gradient,
                                                        _numpy_view(param))

    # -- the optimizer API ------------------------------------------------
    def step(self, closure=None):
        loss = None
        if self._update == "average":
            if closure is not None:
                with _torch.enable_grad():
                    loss = closure()
            if not self._skip_synchronize:
                self.synchronize()
            elif not self._synchronized:
                raise _bad("step() inside skip_synchronize() needs synchronize() first")
            self._synchronized = False
            self._optimizer.step()
            self._steps += 1
            return loss
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
            self._wait_all()  # the pulls wrote into the parameters
            self._pushed_grads = [None] * len(self._params)
            self._client.clock()
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
        # Each group's change since the last average is pushed, and the
        # average model pulled into the group's start, which is then the
        # model and the next round's start.
        for k, name in enumerate(self._group_names):
            for param, start, delta in self._group_views(k):
                _np.subtract(start, param, out=delta)
            self._handles[k] = self._client.push_pull_async(name, self._group_delta[k],
                                                            self._group_start[k])
        self._wait_all()
        self._client.clock()
        self._model_from_groups()

    def synchronize(self):
        """update='average': waits for this step's averaged gradients and
        writes them into each parameter's .grad (then clip them, say, and
        call step() inside skip_synchronize()). Otherwise: every parameter
        current in the model (with a scheduler and a model, forward
        pre-hooks otherwise do this layer by layer)."""
        if self._update == "average":
            if self._synchronized:
                return
            # Parameters without a gradient this step (unused layers) still push.
            for i in reversed(range(len(self._params))):
                self._hand_over(i)
            try:
                self._wait_all()
            except _harrier.DeadlineExceededError as e:
                raise _harrier.DeadlineExceededError(
                    f"DistributedOptimizer step {self._steps}: not every worker pushed its "
                    f"gradients in time (a worker that stopped training, or never calls "
                    f"step(), leaves the others waiting): {e.message}",
                    e.code, e.code_value) from None
            scale = self._predivide * (self._client.num_workers if self._op == Sum else 1.0)
            with _torch.no_grad():
                for i, param in enumerate(self._params):
                    averaged = self._bucket_view(self._bucket_pulled, i)
                    if self._bucket_in_place[self._bucket_of[i]]:
                        if scale != 1.0:
                            averaged.mul_(scale)
                        param.grad = averaged
                        continue
                    if scale != 1.0:
                        averaged = averaged * scale
                    if param.grad is None:
                        param.grad = averaged.to(param.dtype, copy=True)
                    else:
                        param.grad.copy_(averaged)
            for k, in_place in enumerate(self._bucket_in_place):
                if in_place:  # the gradients handed back are the next push
                    self._bucket_grads[k], self._bucket_pulled[k] = (
                        self._bucket_pulled[k], self._bucket_grads[k])
            self._handed = [False] * len(self._params)
            self._passes = [0] * len(self._params)
            self._bucket_filled = [0] * len(self._buckets)
            self._synchronized = True
            return
        if self._scheduler is not None:
            for i in range(len(self._params)):
                self._make_current(i)

    @_contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize() (call it before,
        as Horovod's gradient clipping recipe does)."""
        self._skip_synchronize = True
        try:
            yield
        finally:
            self._skip_synchronize = False

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
        barrier: every worker's last update included). update='average'
        keeps no parameters on the shards: nothing to pull."""
        if self._update == "average":
            return
        if self._scheduler is not None:
            self._scheduler.refresh()  # into the staging arrays
            with _torch.no_grad():
                for param, pulled in zip(self._params, self._pulled):
                    _numpy_view(param)[...] = pulled
            return
        if self._update == "worker":
            self._pull_model()
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

    @property
    def state(self):
        return self._optimizer.state

    @property
    def defaults(self):
        return self._optimizer.defaults

    def add_param_group(self, param_group):
        raise _bad("DistributedOptimizer: parameters are fixed when it is created; add the group "
                   "to the optimizer before wrapping it")

    def __repr__(self):
        return f"DistributedOptimizer({self._optimizer!r}, update={self._update!r})"

    def __getstate__(self):
        raise TypeError("a DistributedOptimizer holds a connection; save its state_dict()")

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
    client = client or (_job.client if _job is not None else None) or _default_client
    if client is None:
        raise _bad("broadcast_parameters needs harrier.torch.init() (or client=)")
    if not 0 <= root_rank < client.num_workers:
        raise _bad(f"root_rank {root_rank} is not in [0, {client.num_workers})")
    items = list(params.items()) if hasattr(params, "items") else list(params)
    if isinstance(client, _LocalClient):
        return
    round_ = getattr(client, "_broadcasts", 0)
    client._broadcasts = round_ + 1
    prefix = f"harrier.broadcast/{round_}/"
    tensors = [(name, t) for name, t in items if isinstance(t, _torch.Tensor) and t.numel() > 0]
    for name, tensor in tensors:
        _check_device(tensor, f"broadcast_parameters {name!r}", staged=True)
    if client.rank == root_rank:
        for name, tensor in tensors:
            client.register(prefix + name,
                            tensor.detach().reshape(-1).to(_torch.float32).cpu().numpy(),
                            own_clock=True)
    client.barrier(prefix + "registered")
    if client.rank != root_rank:
        with _torch.no_grad():
            for name, tensor in tensors:
                client.register(prefix + name, (tensor.numel(),), own_clock=True)
                values = client.pull(prefix + name)
                tensor.copy_(_torch.from_numpy(values).reshape(tensor.shape).to(tensor.dtype))


# -- embeddings on sparse tables ------------------------------------------------

# register_sparse's options an Embedding passes on as they are.
_SPARSE_OPTIONS = ("beta1", "beta2", "epsilon", "initial_accumulator", "max_rows", "max_bytes",
                   "eviction", "ttl_steps", "admit_after", "admit_probability", "sync",
                   "staleness", "wire_dtype", "cache_rows", "cache_staleness")


class _SparseTable:
    """A sparse table of this process and its pushes in flight (one per
    backward). A forward waits for them before it pulls: it sees this
    worker's own last push, and a push's error surfaces there."""

    def __init__(self, client, name, dim, options):
        self.client, self.name, self.dim, self.options = client, name, dim, dict(options)
        self.lock = _threading.Lock()
        self.pending = []

    def synchronize(self):
        with self.lock:
            pending, self.pending = self.pending, []
        error = None
        for handle in pending:
            try:
                handle.wait()
            except _harrier.Error as e:
                error = error or e
        if error is not None:
            raise type(error)(f"sparse table '{self.name}': the push of a backward failed: "
                              f"{error.message}", error.code, error.code_value) from None

    def pull(self, ids):
        """The rows of distinct int64 `ids` at the table's clock, as a new
        (len(ids), dim) float32 tensor."""
        self.synchronize()
        rows = _np.empty((len(ids), self.dim), dtype=_np.float32)
        try:
            self.client.pull_rows(self.name, ids, rows)
        except _harrier.DeadlineExceededError as e:
            raise _harrier.DeadlineExceededError(
                f"sparse table '{self.name}' at clock {self.client.tensor_clock(self.name)}: "
                "not every worker pushed its rows in time (under BSP every worker runs as "
                f"many training backward passes through the table): {e.message}",
                e.code, e.code_value) from None
        return _torch.from_numpy(rows)

    def push(self, ids, grad):
        """Starts the push of the distinct rows' gradients (the table's clock
        advances now)."""
        grads = _np.ascontiguousarray(grad.detach().to(_torch.float32).cpu().numpy())
        handle = self.client.push_rows_async(self.name, ids, grads)
        with self.lock:
            self.pending.append(handle)


class _SharedWait:
    """One push of several tables, in each table's list of pushes in flight:
    the first wait waits, later ones give its outcome again."""

    def __init__(self, handle):
        self.handle, self.waited, self.error = handle, False, None

    def wait(self, timeout=None):
        if not self.waited:
            try:
                self.handle.wait()
            except _harrier.Error as e:
                self.error = e
            self.waited = True
        if self.error is not None:
            raise self.error


class _PulledRowsOfTables(_torch.autograd.Function):
    """_PulledRows for several tables of one job in one operation (one call
    per shard each way). A table whose rows were not used in the loss still
    gets its push (of zeros), so that every table's clock advances once a
    backward."""

    @staticmethod
    def forward(ctx, trigger, client, tables, ids):
        ctx.client, ctx.tables, ctx.ids = client, tables, ids
        for table in tables:
            table.synchronize()
        try:
            rows = client.pull_rows_many_async(
                {table.name: table_ids for table, table_ids in zip(tables, ids)}).wait()
        except _harrier.DeadlineExceededError as e:
            raise _harrier.DeadlineExceededError(
                f"sparse tables {', '.join(repr(t.name) for t in tables)}: not every worker "
                "pushed its rows in time (under BSP every worker runs as many training "
                f"backward passes through the tables): {e.message}", e.code,
                e.code_value) from None
        return tuple(_torch.from_numpy(rows[table.name]) for table in tables)

    @staticmethod
    def backward(ctx, *grads):
        gradients = {}
        for table, table_ids, grad in zip(ctx.tables, ctx.ids, grads):
            gradients[table.name] = (table_ids, _np.ascontiguousarray(
                grad.detach().to(_torch.float32).cpu().numpy()))
        pending = _SharedWait(ctx.client.push_rows_many_async(gradients))
        for table in ctx.tables:
            with table.lock:
                table.pending.append(pending)
        return None, None, None, None


class _PulledRows(_torch.autograd.Function):
    """forward: the rows of distinct ids, pulled; backward: their gradient
    (already summed over each id's uses) pushed to the shards. `trigger` is
    an empty tensor that requires grad, so that backward reaches here."""

    @staticmethod
    def forward(ctx, trigger, table, ids):
        ctx.table, ctx.ids = table, ids
        return table.pull(ids)

    @staticmethod
    def backward(ctx, grad):
        ctx.table.push(ctx.ids, grad)
        return None, None, None


class _SparseEmbedding(_torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table, its registration,
    and rows pulled for a batch's distinct ids."""

    def __init__(self, name, embedding_dim, optimizer, lr, init_scale, seed, options,
                 padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 sparse=False):
        super().__init__()
        kind = type(self).__name__
        if not isinstance(name, str) or not name:
            raise _bad(f"{kind}: name must be a non-empty str (the table's name on the shards, "
                       f"the same on every worker), got {name!r}")
        if (not isinstance(embedding_dim, int) or isinstance(embedding_dim, bool)
                or not 1 <= embedding_dim <= 1 << 16):
            raise _bad(f"{kind} '{name}': embedding_dim must be an int in [1, 65536], got "
                       f"{embedding_dim!r}")
        unknown = sorted(set(options) - set(_SPARSE_OPTIONS))
        if unknown:
            raise TypeError(f"{kind} '{name}': unknown option(s) {', '.join(unknown)}; the "
                            f"options are {', '.join(_SPARSE_OPTIONS)}")
        if padding_idx is not None and (not isinstance(padding_idx, int)
                                        or isinstance(padding_idx, bool)
                                        or not -(1 << 63) <= padding_idx < 1 << 63):
            raise _bad(f"{kind} '{name}': padding_idx must be None or an int64 id, got "
                       f"{padding_idx!r}")
        if max_norm is not None and not float(max_norm) > 0:
            raise _bad(f"{kind} '{name}': max_norm must be None or positive, got {max_norm!r}")
        self.name = name
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.max_norm = None if max_norm is None else float(max_norm)
        self.norm_type = float(norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)  # accepted for torch's signature: rows are always pushed sparse
        self.options = dict(optimizer=optimizer, lr=float(lr), init_scale=float(init_scale),
                            seed=int(seed), **options)
        self._trigger = _torch.empty(0, requires_grad=True)
        self._job = None
        self._table = None
        if _job is not None:
            self.table()  # registered now: a mistake in the options shows here

    def table(self):
        """The table, registered with the job on first use (init() first)."""
        job = _need_job(f"{type(self).__name__} '{self.name}'")
        if self._job is not job:
            self._table = job.sparse_table(self.name, self.embedding_dim, self.options)
            self._job = job
        return self._table

    def _rows(self, input):
        """The rows of input's distinct ids (on input's device), in input's
        shape each id's index among them, and the index of padding_idx's
        all-zero row (None when the batch has no padding id): that id is
        neither pulled nor pushed."""
        if not isinstance(input, _torch.Tensor):
            raise _bad(f"{type(self).__name__} '{self.name}': input must be a tensor of int64 "
                       f"ids, got {type(input).__name__}")
        if input.dtype not in (_torch.int64, _torch.int32):
            raise _bad(f"{type(self).__name__} '{self.name}': ids must be int64 (or int32), got "
                       f"{input.dtype}")
        table = self.table()
        distinct, inverse = _torch.unique(input.reshape(-1), sorted=True, return_inverse=True)
        ids = _np.ascontiguousarray(distinct.to(_torch.int64).cpu().numpy())
        pad = None
        if self.padding_idx is not None:
            found = _np.flatnonzero(ids == self.padding_idx)
            if len(found):
                pad = int(found[0])
                ids = _np.ascontiguousarray(_np.delete(ids, pad))
        rows = _PulledRows.apply(self._trigger, table, ids)
        if pad is not None:
            zero = _torch.zeros(1, self.embedding_dim, dtype=rows.dtype)
            rows = _torch.cat([rows[:pad], zero, rows[pad:]])
        if input.device.type != "cpu":
            rows = rows.to(input.device)
        return rows, inverse.reshape(input.shape), pad

    def _lookup_options(self, pad):
        return dict(padding_idx=pad, max_norm=self.max_norm, norm_type=self.norm_type,
                    scale_grad_by_freq=self.scale_grad_by_freq)

    def synchronize(self):
        """Waits for this table's pushes in flight (each backward starts one;
        the next forward waits for them anyway, and so does shutdown())."""
        self.table().synchronize()

    def stats(self):
        """This worker's counters of the table (Client.sparse_stats)."""
        return self.table().client.sparse_stats(self.name)

    def __getstate__(self):  # copies and pickles find the table again on first use
        state = dict(self.__dict__)
        state["_job"] = state["_table"] = None
        return state

    def extra_repr(self):
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        lookup = "".join(f", {k}={getattr(self, k)!r}" for k, default in
                         (("padding_idx", None), ("max_norm", None), ("norm_type", 2.0),
                          ("scale_grad_by_freq", False)) if getattr(self, k) != default)
        return f"{self.name!r}, {self.embedding_dim}, {options}{lookup}"


class Embedding(_SparseEmbedding):
    """torch.nn.Embedding over a sparse table on the shards: a row of
    `embedding_dim` float32 for every int64 id (any value: hashed features
    need no vocabulary), created on first use from (seed, name, id), uniform
    in [-init_scale, init_scale).

    forward(input) takes int64 (or int32) ids of any shape and returns
    (*input.shape, embedding_dim). It pulls the rows of the batch's distinct
    ids at the table's clock; backward pushes their gradients (summed over
    each id's uses) and the shards step each row with the table's optimizer
    ("sgd", "adagrad", "rowwise_adagrad" or "adam", with lr). So the rows
    are not torch Parameters and take no torch optimizer; under BSP the
    shards average each row's gradient over the workers, as
    DistributedOptimizer averages dense ones.

    The table's clock counts this worker's pushes, one per backward through
    the module: a forward without backward (evaluation, torch.no_grad())
    pushes nothing. Under BSP every worker must push as often as the others
    (the same number of training steps, as with DistributedOptimizer), or
    the others' pulls wait for it until rpc_timeout. A push runs while the
    step goes on; the next forward waits for it.

    name: the table's name, the same on every worker (modules of one name
    share a table). options: register_sparse's others (beta1, beta2,
    epsilon, initial_accumulator, max_rows, max_bytes, eviction, ttl_steps,
    admit_after, admit_probability, sync, staleness, wire_dtype, cache_rows,
    cache_staleness). Registered in the constructor after init(), or else on
    the first forward. Without shards (one process, no HARRIER_SERVERS) the
    table lives in this process with the shards' arithmetic.

    torch's lookup keywords: padding_idx is an id (any int64; there is no
    vocabulary to count back from) whose output is all zeros and which is
    never pulled, pushed or stored; max_norm and norm_type rescale each row
    as it is looked up, as torch does, but the shards keep the row as
    stepped (torch writes the rescaled row back into its weight);
    scale_grad_by_freq as torch's; sparse is accepted and changes nothing
    (only the rows a batch used are ever pushed).
    """

    def __init__(self, name, embedding_dim, optimizer="sgd", lr=0.01, init_scale=0.01, seed=0,
                 padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 sparse=False, **options):
        super().__init__(name, embedding_dim, optimizer, lr, init_scale, seed, options,
                         padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)

    def forward(self, input):
        rows, inverse, pad = self._rows(input)
        return _torch.nn.functional.embedding(inverse, rows, **self._lookup_options(pad))


class EmbeddingBag(_SparseEmbedding):
    """torch.nn.EmbeddingBag over a sparse table (Embedding says how rows
    are kept, pulled, pushed and stepped): each bag of ids reduced to one
    row by mode "mean" (default), "sum" or "max".

    forward(input, offsets=None, per_sample_weights=None) as
    torch.nn.functional.embedding_bag takes them: a 2-D input of equal bags,
    or a 1-D input with the offsets where each bag starts
    (include_last_offset as torch's); per_sample_weights with mode "sum".
    padding_idx (an id) is left out of its bag's reduction, as in torch;
    max_norm, norm_type, scale_grad_by_freq and sparse as Embedding's.
    """

    def __init__(self, name, embedding_dim, mode="mean", optimizer="sgd", lr=0.01,
                 init_scale=0.01, seed=0, include_last_offset=False, padding_idx=None,
                 max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False,
                 **options):
        if mode not in ("mean", "sum", "max"):
            raise _bad(f"EmbeddingBag '{name}': mode must be 'mean', 'sum' or 'max', got {mode!r}")
        super().__init__(name, embedding_dim, optimizer, lr, init_scale, seed, options,
                         padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def forward(self, input, offsets=None, per_sample_weights=None):
        rows, inverse, pad = self._rows(input)
        return _torch.nn.functional.embedding_bag(
            inverse, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset, **self._lookup_options(pad))

    def extra_repr(self):
        return f"{super().extra_repr()}, mode={self.mode!r}"


class EmbeddingBagCollection(_torch.nn.Module):
    """Several EmbeddingBag tables looked up together, as torchrec's
    EmbeddingBagCollection groups a model's tables: forward pulls the rows
    of every table in one operation (one call per shard, where one
    EmbeddingBag per table makes tables x shards calls) and backward pushes
    them the same way. Each table is a sparse table on the shards as
    EmbeddingBag's (modules of one name share it).

    tables: {name: embedding_dim} (or [(name, embedding_dim), ...]); mode,
    optimizer, lr, init_scale, seed, include_last_offset and `options`
    (register_sparse's others) apply to every table.

    forward(features) takes {name: input} for each table, input a 2-D
    tensor of equal bags of ids, or a tuple (input, offsets) or (input,
    offsets, per_sample_weights) as torch.nn.functional.embedding_bag takes
    them, and returns {name: (bags, embedding_dim)}. Every table must be in
    every forward (each backward advances every table's clock by one).
    """

    def __init__(self, tables, mode="mean", optimizer="sgd", lr=0.01, init_scale=0.01, seed=0,
                 include_last_offset=False, **options):
        super().__init__()
        tables = list(tables.items() if isinstance(tables, dict) else tables)
        if not tables:
            raise _bad("EmbeddingBagCollection: no tables")
        names = [name for name, _ in tables]
        if len(set(names)) != len(names):
            raise _bad(f"EmbeddingBagCollection: a table named twice in {names}")
        self.bags = _torch.nn.ModuleDict()
        for name, dim in tables:
            # Each table's name, options and registration as EmbeddingBag's;
            # ModuleDict keys cannot hold dots, so they are positions.
            self.bags[str(len(self.bags))] = EmbeddingBag(
                name, dim, mode=mode, optimizer=optimizer, lr=lr, init_scale=init_scale,
                seed=seed, include_last_offset=include_last_offset, **options)
        self._trigger = _torch.empty(0, requires_grad=True)

    @property
    def names(self):
        return [bag.name for bag in self.bags.values()]

    def forward(self, features):
        features = dict(features)
        bags = list(self.bags.values())
        missing = [bag.name for bag in bags if bag.name not in features]
        extra = sorted(set(features) - {bag.name for bag in bags})
        if missing or extra:
            raise _bad(f"EmbeddingBagCollection: features must name every table once; missing "
                       f"{missing}, unknown {extra}")
        tables, ids, lookups = [], [], []
        for bag in bags:
            feature = features[bag.name]
            if isinstance(feature, (tuple, list)):
                input, rest = feature[0], list(feature[1:])
            else:
                input, rest = feature, []
            if len(rest) > 2:
                raise _bad(f"EmbeddingBagCollection '{bag.name}': expected input, (input, "
                           "offsets) or (input, offsets, per_sample_weights)")
            offsets = rest[0] if rest else None
            weights = rest[1] if len(rest) > 1 else None
            if not isinstance(input, _torch.Tensor) or input.dtype not in (_torch.int64,
                                                                           _torch.int32):
                raise _bad(f"EmbeddingBagCollection '{bag.name}': input must be a tensor of "
                           f"int64 (or int32) ids, got {getattr(input, 'dtype', type(input))}")
            distinct, inverse = _torch.unique(input.reshape(-1), sorted=True, return_inverse=True)
            tables.append(bag.table())
            ids.append(_np.ascontiguousarray(distinct.to(_torch.int64).cpu().numpy()))
            lookups.append((input, inverse.reshape(input.shape), offsets, weights))
        client = tables[0].client
        rows = _PulledRowsOfTables.apply(self._trigger, client, tables, ids)
        out = {}
        for bag, table_rows, (input, inverse, offsets, weights) in zip(bags, rows, lookups):
            if input.device.type != "cpu":
                table_rows = table_rows.to(input.device)
            out[bag.name] = _torch.nn.functional.embedding_bag(
                inverse, table_rows, offsets, mode=bag.mode, per_sample_weights=weights,
                include_last_offset=bag.include_last_offset)
        return out

    def synchronize(self):
        """Waits for the tables' push in flight."""
        for bag in self.bags.values():
            bag.synchronize()
