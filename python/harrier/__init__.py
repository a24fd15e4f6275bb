"""Harrier's Python client: push gradients to and pull parameters from the
parameter-server shards (README "From PyTorch").

    import harrier
    client = harrier.Client(servers=["127.0.0.1:50061"])
    client.register("w", weights)          # first registration wins
    client.pull("w", weights)              # waits as the sync mode says
    client.push("w", gradient)             # for the current clock
    client.clock()                         # next iteration

    client.register_sparse("emb", 16, optimizer="adagrad", lr=0.05)  # rows keyed by int64
    rows = client.pull_rows("emb", ids)    # (len(ids), 16) float32, at the table's clock
    client.push_rows("emb", ids, grads)    # summed per id; the shards' per-row optimizer

Arrays are numpy arrays or CPU torch tensors. Contiguous float32 memory is
used in place (no copy); other inputs are copied to float32 first, and
outputs must be contiguous float32 already. Every call that can block
releases the GIL. Failures raise a subclass of harrier.Error carrying the
status code and message.
"""

import os as _os
import sys as _sys

import numpy as _np

from . import _harrier

__all__ = [
    "Client", "Handle", "Scheduler", "Error",
    "CancelledError", "UnknownError", "InvalidArgumentError", "DeadlineExceededError",
    "NotFoundError", "AlreadyExistsError", "PermissionDeniedError", "ResourceExhaustedError",
    "FailedPreconditionError", "AbortedError", "OutOfRangeError", "UnimplementedError",
    "InternalError", "UnavailableError", "DataLossError", "UnauthenticatedError",
]


class Error(Exception):
    """A failed Harrier call. `code` is the status code's name
    ("DEADLINE_EXCEEDED"), `code_value` its number, `message` the text."""

    def __init__(self, message, code="UNKNOWN", code_value=2):
        super().__init__(message)
        self.message = message
        self.code = code
        self.code_value = code_value

    def __str__(self):
        return f"{self.code}: {self.message}"


class CancelledError(Error): pass
class UnknownError(Error): pass
class InvalidArgumentError(Error, ValueError): pass
class DeadlineExceededError(Error, TimeoutError): pass
class NotFoundError(Error, LookupError): pass
class AlreadyExistsError(Error): pass
class PermissionDeniedError(Error, PermissionError): pass
class ResourceExhaustedError(Error): pass
class FailedPreconditionError(Error): pass
class AbortedError(Error): pass
class OutOfRangeError(Error, IndexError): pass
class UnimplementedError(Error, NotImplementedError): pass
class InternalError(Error): pass
class UnavailableError(Error, ConnectionError): pass
class DataLossError(Error): pass
class UnauthenticatedError(Error): pass


_harrier._set_error_classes({
    "CANCELLED": CancelledError, "UNKNOWN": UnknownError,
    "INVALID_ARGUMENT": InvalidArgumentError, "DEADLINE_EXCEEDED": DeadlineExceededError,
    "NOT_FOUND": NotFoundError, "ALREADY_EXISTS": AlreadyExistsError,
    "PERMISSION_DENIED": PermissionDeniedError, "RESOURCE_EXHAUSTED": ResourceExhaustedError,
    "FAILED_PRECONDITION": FailedPreconditionError, "ABORTED": AbortedError,
    "OUT_OF_RANGE": OutOfRangeError, "UNIMPLEMENTED": UnimplementedError,
    "INTERNAL": InternalError, "UNAVAILABLE": UnavailableError,
    "DATA_LOSS": DataLossError, "UNAUTHENTICATED": UnauthenticatedError,
})

Handle = _harrier.Handle


def _bad(message):
    return InvalidArgumentError(message, "INVALID_ARGUMENT", 3)


def _is_torch_tensor(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "numpy")


def _device_tensor(t, what):
    """A CUDA tensor as the extension reads it (__cuda_array_interface__),
    or one clear line saying why it cannot be."""
    if t.device.type != "cuda":
        raise _bad(f"{what}: a tensor on {t.device}; the Python client takes CPU and CUDA tensors")
    if not _harrier.built_with_cuda:
        raise _bad(f"{what}: a tensor on {t.device}, but this Harrier module was built without "
                   "CUDA (build it with `bazel build --config=cuda //python:package` where the "
                   "CUDA toolkit is; python/README.md, 'CUDA tensors')")
    return t


def _readable(x, what):
    """A float32 C-contiguous array with x's values: x's own memory when it
    already is one, else a copy. CUDA tensors stay on the device."""
    if not _is_torch_tensor(x) and hasattr(x, "__cuda_array_interface__"):
        return x  # CuPy, Numba: the extension reads (and checks) the interface
    if _is_torch_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = _device_tensor(t, what)
            return t if str(t.dtype) == "torch.float32" and t.is_contiguous() else (
                t.float().contiguous())
        x = t.numpy()  # complex dtypes are refused below
    array = _np.asarray(x)
    if array.dtype != _np.float32 or not array.flags.c_contiguous:
        if array.dtype.kind not in "fiub":
            raise _bad(f"{what}: expected real numbers, got dtype {array.dtype}")
        array = _np.ascontiguousarray(array, dtype=_np.float32)
    return array


def _writable(x, what):
    """x itself as a float32 array the pull writes into (no copy: a copy
    would drop the result)."""
    if not _is_torch_tensor(x) and hasattr(x, "__cuda_array_interface__"):
        return x
    if _is_torch_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            t = _device_tensor(t, what)
            if str(t.dtype) != "torch.float32" or not t.is_contiguous():
                raise _bad(f"{what}: expected a contiguous float32 tensor, got {t.dtype}"
                           f"{'' if t.is_contiguous() else ' (not contiguous)'}")
            return t
        if str(t.dtype) != "torch.float32" or not t.is_contiguous():
            raise _bad(f"{what}: expected a contiguous float32 CPU tensor, got {t.dtype} on "
                       f"{t.device}{'' if t.is_contiguous() else ' (not contiguous)'}")
        return t.numpy()
    if not isinstance(x, _np.ndarray):
        raise _bad(f"{what}: expected a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype != _np.float32 or not x.flags.c_contiguous or not x.flags.writeable:
        raise _bad(f"{what}: expected a writable C-contiguous float32 array, got {x.dtype}"
                   f"{'' if x.flags.c_contiguous else ' (not contiguous)'}"
                   f"{'' if x.flags.writeable else ' (read-only)'}")
    return x


def _elements(x):
    if _is_torch_tensor(x):
        return x.numel()
    if not isinstance(x, _np.ndarray) and hasattr(x, "__cuda_array_interface__"):
        return int(_np.prod(x.__cuda_array_interface__["shape"], dtype=_np.int64))
    return x.size


def _ids(x, what):
    """x as C-contiguous int64 ids: x's own memory when it already is, else a
    copy of an integer array whose every value int64 holds (int8..int32,
    uint8..uint32). Floats, bools, uint64 and CUDA tensors are refused."""
    if _is_torch_tensor(x):
        t = x.detach()
        if t.device.type != "cpu":
            raise _bad(f"{what}: ids on {t.device}; sparse tables take ids in host memory "
                       "(move them with .cpu())")
        x = t.numpy()
    elif hasattr(x, "__cuda_array_interface__"):
        raise _bad(f"{what}: a CUDA array; sparse tables take ids in host memory")
    array = _np.asarray(x)
    if array.dtype == _np.int64 and array.flags.c_contiguous:
        return array
    if array.dtype == _np.uint64:
        raise _bad(f"{what}: uint64 ids; give int64 (ids.view(np.int64) keeps every bit)")
    if array.dtype.kind not in "iu" or array.dtype.itemsize > 8:
        raise _bad(f"{what}: expected integer ids (int64), got dtype {array.dtype}")
    return _np.ascontiguousarray(array, dtype=_np.int64)


def _duration(value, what):
    value = float(value)
    if not value > 0:
        raise _bad(f"{what} must be a positive number of seconds, got {value}")
    return value


class _MappedHandle:
    """A binding Handle whose result is passed through `mapping` (the pulled
    arrays of several tables, as a dict by name)."""

    def __init__(self, handle, mapping):
        self._handle, self._mapping = handle, mapping

    def wait(self, timeout=None):
        return self._mapping(self._handle.wait(timeout))

    @property
    def done(self):
        return self._handle.done

    @property
    def id(self):
        return self._handle.id


def _timeline_path(pattern, rank):
    """The file a worker of `rank` writes: "{rank}" in the pattern replaced
    by the rank; without it only rank 0 writes one (as Horovod's timeline
    is written once): harrier-worker --timeline's rule, from the C++."""
    return _harrier.timeline_path_for(pattern, rank)


def _start_timeline(client, pattern, from_environment=False):
    path = _timeline_path(_os.fspath(pattern), client.rank)
    if not path:
        return
    try:
        client.start_timeline(path)
    except FailedPreconditionError:
        if not from_environment:
            raise
        # Another Client of this process records to that file (two clients
        # of one rank, both under HARRIER_TIMELINE): the first keeps it.
        print(f"harrier: rank {client.rank}: timeline: {path} is recorded by another "
              "Client of this process; this one records none", file=_sys.stderr)
        return
    print(f"harrier: rank {client.rank}: timeline: {path}", file=_sys.stderr)


class Client:
    """One worker's connection to every shard (worker/client.h).

    servers: "host:port" of every shard, shard 0 first (same order on every
    worker). rank: None lets the control plane pick the lowest free rank.
    codec / pull_codec: compression specs ("topk:ratio=0.01", "powersgd:rank=2",
    see common/codec/README.md); pull_codec="paired" pulls with the codec that
    goes with each tensor's push codec (fp16 with fp16, top-k with a top-k of
    its ratio, PowerSGD with PowerSGD, sign codecs with EF-sign), "none" pulls
    dense. transport: "auto" (per shard: "tcp" where the shard serves it and
    there is no TLS, "grpc" otherwise; `data_paths` says which), "tcp",
    "grpc" or "ucx". tcp_congestion: the tcp data path's TCP congestion
    control, the first of these names the kernel allows ("": its default).
    Durations are in
    seconds. device: "auto" (in a module built with --config=cuda, tensors
    registered in device memory are compressed on the GPU) or "cpu". Not
    thread-affine: any thread may call any method.
    """

    def __init__(self, servers, rank=None, codec="none", pull_codec="none", transport="auto",
                 rpc_timeout=60.0, connect_timeout=30.0, job="harrier", worker_name="",
                 chunk_bytes=4 << 20, compress_min_bytes=16 << 10, heartbeat_interval=1.0,
                 retry_timeout=30.0, max_queued_calls=4096, tls_ca_file="", tls_cert_file="",
                 tls_key_file="", auth_token="", device="auto", max_calls_in_flight=4,
                 pull_connection=True, tcp_congestion=_harrier.default_tcp_congestion):
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s]
        servers = list(servers)
        if not servers:
            raise _bad("servers is empty: give host:port of every shard, shard 0 first")
        if rank is not None and (not isinstance(rank, int) or rank < 0):
            raise _bad(f"rank must be None or a non-negative int, got {rank!r}")
        options = _harrier.ClientOptions()
        options.servers = servers
        options.rank = -1 if rank is None else rank
        options.codec = codec
        options.pull_codec = pull_codec
        options.transport = transport
        # The tcp data path's congestion control (harrier-worker --tcp_congestion).
        options.tcp_congestion_control = str(tcp_congestion)
        options.rpc_timeout = _duration(rpc_timeout, "rpc_timeout")
        options.connect_timeout = _duration(connect_timeout, "connect_timeout")
        options.job = job
        options.worker_name = worker_name
        options.chunk_bytes = int(chunk_bytes)
        options.compress_min_bytes = int(compress_min_bytes)
        options.heartbeat_interval = float(heartbeat_interval)
        options.retry_timeout = float(retry_timeout)
        options.max_queued_calls = int(max_queued_calls)
        if (not isinstance(max_calls_in_flight, int) or isinstance(max_calls_in_flight, bool)
                or max_calls_in_flight < 1):
            raise _bad(f"max_calls_in_flight must be an int >= 1, got {max_calls_in_flight!r}")
        # Shard calls in flight per direction; a job of many sparse tables
        # does better with about tables x shards (docs/performance.md).
        options.max_calls_in_flight = max_calls_in_flight
        # The gRPC data path: pulls on a connection of their own per shard.
        options.pull_connection = bool(pull_connection)
        options.tls_ca_file = tls_ca_file
        options.tls_cert_file = tls_cert_file
        options.tls_key_file = tls_key_file
        options.auth_token = auth_token
        self._client = _harrier.Client(options, device)
        # As harrier-worker's --timeline (HARRIER_TIMELINE), so a job
        # started by harrier-launch --timeline_filename records one.
        if _os.environ.get("HARRIER_TIMELINE"):
            _start_timeline(self, _os.environ["HARRIER_TIMELINE"], from_environment=True)
        self._codec = codec
        self._shapes = {}
        self._memory = {}
        self._sparse = {}  # sparse table name -> dim

    # -- who we are ---------------------------------------------------------
    @property
    def rank(self):
        return self._client.rank

    @property
    def num_workers(self):
        return self._client.num_workers

    @property
    def num_shards(self):
        return self._client.num_shards

    @property
    def data_paths(self):
        """Each shard's data path, shard 0 first: "tcp", "grpc" or "ucx".

        The one in use now: with transport "auto", a shard that restarted
        without tcp (harrier-server --tcp=false) moves from "tcp" to "grpc".
        """
        return list(self._client.data_paths)

    @property
    def codec(self):
        """The push codec of tensors registered without one of their own."""
        return self._codec

    @property
    def current_clock(self):
        """The iteration later pushes are for."""
        return self._client.current_clock

    @property
    def chunk_bytes(self):
        return self._client.chunk_bytes

    @property
    def sync(self):
        """{"mode": "bsp"|"ssp"|"asp"|"local", "staleness": s, "local_steps": H,
        "optimizer": the shards' --optimizer ("delta" under local SGD), "lr",
        "momentum", "weight_decay"}."""
        return self._client.sync()

    def shape(self, name):
        try:
            return self._shapes[name]
        except KeyError:
            raise NotFoundError(f"tensor '{name}' is not registered by this client", "NOT_FOUND", 5)

    # -- tensors --------------------------------------------------------------
    def register(self, name, shape_or_array, kind="parameters", own_clock=False, codec="",
                 pull_codec="", memory=None, staging_buffers=False):
        """Declares a float32 tensor: a shape (zeros unless another worker
        registered it first) or an array (its shape and initial values). The
        first registration wins; later ones must agree on the shape.

        kind: "parameters" (the shards' optimizer steps with the pushes, under
        the job's sync mode) or "average" (the value is the average of each
        round's pushes, one per live worker: an allreduce; BSP rounds
        whatever the sync mode, a clock of its own). own_clock: the tensor
        counts its own pushes instead of following clock(), so it may be
        registered at any time and pushed at its own pace; push() is for
        tensor_clock(name) and moves it on, pull() waits for the round of
        the last push. codec / pull_codec: this tensor's codecs ("" = the
        client's; pull_codec "paired": the pair of its push codec). memory:
        "host" or "device" (the buffers of every later call are CUDA arrays,
        compressed on the device; a module built with --config=cuda); None:
        "device" for a CUDA tensor, else "host". staging_buffers: the arrays
        pushed and pulled for this name are the caller's own staging (host
        memory): a pushed one is written just before the push and untouched
        until the push is waited for, so it is sent from where it is rather
        than copied first; a pulled one is read only after the pull
        succeeded, so the reply is written into it while it is checked (a
        corrupt reply fails the pull with the array part-written)."""
        if isinstance(shape_or_array, (tuple, list)) and all(
                isinstance(d, int) for d in shape_or_array):
            shape, initial = tuple(shape_or_array), None
            if any(d < 0 for d in shape):
                raise _bad(f"tensor '{name}': negative dimension in {shape}")
        elif isinstance(shape_or_array, int):
            shape, initial = (shape_or_array,), None
        else:
            initial = _readable(shape_or_array, f"register '{name}'")
            shape = tuple(int(d) for d in initial.shape)
            if _is_torch_tensor(initial):  # on the device: initial values go from the host
                memory = memory or "device"
                initial = initial.cpu().numpy()
        memory = memory or "host"
        self._client.register(name, list(shape), initial, kind, bool(own_clock), codec, pull_codec,
                              memory, bool(staging_buffers))
        self._shapes[name] = shape
        self._memory[name] = memory

    def tensor_clock(self, name):
        """The clock the tensor's next push is for: its own, or clock(). For a
        sparse table: this worker's push_rows count."""
        if name not in self._sparse:
            self.shape(name)
        return self._client.tensor_clock(name)

    def _check_size(self, name, array, what):
        shape = self.shape(name)
        expected = int(_np.prod(shape, dtype=_np.int64))
        if _elements(array) != expected:
            raise _bad(f"{what} '{name}': {_elements(array)} elements, the tensor has {expected} "
                       f"(shape {shape})")
        return array

    def _out(self, name, out, what):
        if out is None:
            if self._memory.get(name) == "device":
                raise _bad(f"{what} '{name}': the tensor is in device memory; give out= (a "
                           "CUDA tensor)")
            return _np.empty(self.shape(name), dtype=_np.float32), None
        return self._check_size(name, _writable(out, f"{what} '{name}' out"), what), out

    def push(self, name, gradient):
        """Sends the gradient for the current clock (waits for the shards'
        acknowledgement)."""
        gradient = _readable(gradient, f"push '{name}'")
        self._client.push(name, self._check_size(name, gradient, "push"))

    def pull(self, name, out=None):
        """The parameters at the current clock, written into `out` (returned)
        or a new numpy array."""
        array, original = self._out(name, out, "pull")
        self._client.pull(name, array)
        return array if original is None else original

    def push_pull(self, name, gradient, out=None):
        """Push for the current clock, then the parameters of clock + 1."""
        grad = self._check_size(name, _readable(gradient, f"push_pull '{name}'"), "push_pull")
        array, original = self._out(name, out, "push_pull")
        self._client.push_pull(name, grad, array)
        return array if original is None else original

    def push_async(self, name, gradient, clock=None, first_chunk=0, num_chunks=0):
        """Starts a push; returns a Handle whose wait(timeout) returns None.
        The gradient's memory must not change until then (the handle keeps
        the array alive). clock / first_chunk / num_chunks: a piece at an
        explicit clock, as the comm scheduler sends them."""
        grad = self._check_size(name, _readable(gradient, f"push_async '{name}'"), "push_async")
        return self._client.push_async(name, grad, clock, first_chunk, num_chunks)

    def pull_async(self, name, out=None, clock=None, first_chunk=0, num_chunks=0):
        """Starts a pull; returns a Handle whose wait(timeout) returns the
        filled array (`out`'s numpy view, or a new array)."""
        array, _ = self._out(name, out, "pull_async")
        return self._client.pull_async(name, array, clock, first_chunk, num_chunks)

    def push_pull_async(self, name, gradient, out=None):
        grad = self._check_size(name, _readable(gradient, f"push_pull_async '{name}'"),
                                "push_pull_async")
        array, _ = self._out(name, out, "push_pull_async")
        return self._client.push_pull_async(name, grad, array)

    # -- sparse tables --------------------------------------------------------
    def register_sparse(self, name, dim, optimizer="sgd", lr=0.01, beta1=0.9, beta2=0.999,
                        epsilon=1e-8, initial_accumulator=0.0, init_scale=0.01, seed=0,
                        max_rows=0, eviction="lru", ttl_steps=0, admit_after=0,
                        admit_probability=1.0, sync="", staleness=0, wire_dtype="float32",
                        cache_rows=0, cache_staleness=0, max_bytes=0):
        """Declares a sparse table: rows of `dim` float32 keyed by any int64
        id, created on the shards on first use (uniform in [-init_scale,
        init_scale), a function of seed, name and id alone), each stepped on
        its shard by its own optimizer ("sgd", "adagrad", "rowwise_adagrad",
        "adam"; lr, beta1, beta2, epsilon, initial_accumulator). The table
        keeps its own clock, this worker's push_rows count: the n-th push of
        every worker meets the others' n-th, and pull_rows waits as `sync`
        says ("": the job's --sync; "asp"; "ssp" with `staleness`). max_rows
        per shard (0: the shards' byte budget only) and max_bytes per shard
        (rows, state and index; 0: none; the lower budget holds) with "lru"
        or "lfu" eviction; ttl_steps: rows unused that many clocks are dropped;
        admit_after / admit_probability: new ids are stored after that many
        pushes, then with that probability. wire_dtype: "float32", "fp16",
        "bf16". cache_rows / cache_staleness: the worker's hot-row cache.
        Every worker registers a name once, with the same options."""
        if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= 1 << 16:
            raise _bad(f"sparse table '{name}': dim must be an int in [1, 65536], got {dim!r}")
        for field, value in (("seed", seed), ("max_rows", max_rows), ("ttl_steps", ttl_steps),
                             ("admit_after", admit_after), ("staleness", staleness),
                             ("cache_rows", cache_rows), ("cache_staleness", cache_staleness),
                             ("max_bytes", max_bytes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _bad(f"sparse table '{name}': {field} must be a non-negative int, "
                           f"got {value!r}")
        if seed >= 1 << 64 or admit_after >= 1 << 32:
            raise _bad(f"sparse table '{name}': seed below 2**64 and admit_after below 2**32")
        self._client.register_sparse(
            name, dim, optimizer=optimizer, lr=float(lr), beta1=float(beta1),
            beta2=float(beta2), epsilon=float(epsilon),
            initial_accumulator=float(initial_accumulator), init_scale=float(init_scale),
            seed=seed, max_rows=max_rows, eviction=eviction, ttl_steps=ttl_steps,
            admit_after=admit_after, admit_probability=float(admit_probability), sync=sync,
            staleness=staleness, wire_dtype=wire_dtype, cache_rows=cache_rows,
            cache_staleness=cache_staleness, max_bytes=max_bytes)
        self._sparse[name] = dim

    def sparse_dim(self, name):
        """The row width of sparse table `name` (NotFoundError if this client
        did not register it)."""
        try:
            return self._sparse[name]
        except KeyError:
            raise NotFoundError(f"sparse table '{name}' is not registered by this client",
                                "NOT_FOUND", 5) from None

    def _rows_out(self, name, ids, out, what):
        shape = (int(ids.size), self.sparse_dim(name))
        if out is None:
            return _np.empty(shape, dtype=_np.float32), None
        array = _writable(out, f"{what} '{name}' out")
        if _elements(array) != shape[0] * shape[1]:
            raise _bad(f"{what} '{name}': out has {_elements(array)} elements, {shape[0]} ids "
                       f"need {shape[0] * shape[1]} (shape {shape})")
        return array, out

    def _rows_in(self, name, ids, gradients, what):
        grads = _readable(gradients, f"{what} '{name}' gradients")
        dim = self.sparse_dim(name)
        if _elements(grads) != ids.size * dim:
            raise _bad(f"{what} '{name}': gradients have {_elements(grads)} elements, "
                       f"{ids.size} ids need {ids.size * dim} (shape ({ids.size}, {dim}))")
        return grads

    def pull_rows(self, name, ids, out=None):
        """The rows of `ids` (int64, any values, repeats allowed) at the
        table's clock, written into `out` (float32, len(ids) x dim elements,
        contiguous and writable; returned) or a new (len(ids), dim) array.
        Each distinct id is asked once, of the shard that holds it."""
        ids = _ids(ids, f"pull_rows '{name}' ids")
        array, original = self._rows_out(name, ids, out, "pull_rows")
        self._client.pull_rows(name, ids, array)
        return array if original is None else original

    def push_rows(self, name, ids, gradients):
        """Gradients for the rows of `ids` (len(ids) x dim; a repeated id's
        gradients are summed), one push to every shard (an empty one where
        a shard holds none): the table's clock advances by one."""
        ids = _ids(ids, f"push_rows '{name}' ids")
        self._client.push_rows(name, ids, self._rows_in(name, ids, gradients, "push_rows"))

    def pull_rows_async(self, name, ids, out=None):
        """Starts pull_rows; returns a Handle whose wait(timeout) returns the
        filled array (`out`'s numpy view, or a new array)."""
        ids = _ids(ids, f"pull_rows_async '{name}' ids")
        array, _ = self._rows_out(name, ids, out, "pull_rows_async")
        return self._client.pull_rows_async(name, ids, array)

    def push_rows_async(self, name, ids, gradients):
        """Starts push_rows (the table's clock advances now); returns a Handle
        whose wait(timeout) returns None."""
        ids = _ids(ids, f"push_rows_async '{name}' ids")
        return self._client.push_rows_async(
            name, ids, self._rows_in(name, ids, gradients, "push_rows_async"))

    def pull_rows_many_async(self, tables):
        """pull_rows of several tables in one operation: `tables` maps each
        name to its ids; one call per shard carries them all (where one
        pull_rows per table makes tables x shards calls). Returns a Handle
        whose wait(timeout) returns {name: (len(ids), dim) array}."""
        names, ids, outs = [], [], []
        for name, table_ids in dict(tables).items():
            table_ids = _ids(table_ids, f"pull_rows_many '{name}' ids")
            array, _ = self._rows_out(name, table_ids, None, "pull_rows_many")
            names.append(name)
            ids.append(table_ids)
            outs.append(array)
        return _MappedHandle(self._client.pull_rows_many_async(names, ids, outs),
                             lambda arrays: dict(zip(names, arrays)))

    def pull_rows_many(self, tables):
        """pull_rows_many_async, waited: {name: rows}."""
        return self.pull_rows_many_async(tables).wait()

    def push_rows_many_async(self, tables):
        """push_rows of several tables in one operation: `tables` maps each
        name to (ids, gradients); every table's clock advances now. Returns
        a Handle whose wait(timeout) returns None."""
        names, ids, gradients = [], [], []
        for name, (table_ids, table_gradients) in dict(tables).items():
            table_ids = _ids(table_ids, f"push_rows_many '{name}' ids")
            names.append(name)
            ids.append(table_ids)
            gradients.append(self._rows_in(name, table_ids, table_gradients, "push_rows_many"))
        return self._client.push_rows_many_async(names, ids, gradients)

    def push_rows_many(self, tables):
        """push_rows_many_async, waited."""
        self.push_rows_many_async(tables).wait()

    def sparse_stats(self, name):
        """This worker's counters of a sparse table: rows_pulled (distinct ids
        asked of the shards), rows_pushed, ids_requested (repeats
        included), cache_hits, cache_misses, bytes_pushed, bytes_pulled."""
        return self._client.sparse_stats(name)

    # -- iterations and membership -------------------------------------------
    def clock(self):
        """Advances this worker's iteration; returns the new clock."""
        return self._client.clock()

    def barrier(self, name):
        """Blocks until every worker has entered the barrier of this name."""
        self._client.barrier(name)

    def heartbeat(self):
        self._client.heartbeat()

    def leave(self):
        """This worker has pushed its last clock: no pull or BSP round waits
        for it any more."""
        self._client.leave()

    def stats(self):
        """Counters: bytes_pushed, bytes_pulled (and both per shard, as lists
        in shard order: bytes_pushed_per_shard, bytes_pulled_per_shard),
        pushes, pulls, push_wait_s, pull_wait_s, last_min_clock;
        bytes_staged (device tensors' bytes copied to host memory to be
        sent), bytes_landed (pull replies received straight into device
        memory) and bytes_landed_in_staging (pull replies received straight
        into staging buffers, such as a Scheduler's, over tcp or UCX)."""
        return self._client.stats()

    def start_timeline(self, path, max_bytes=256 << 20):
        """Records this client's pushes and pulls, the waits on them and the
        calls of every Scheduler made from now on to `path`, a Chrome trace
        (open it in ui.perfetto.dev or chrome://tracing), until
        stop_timeline() or close(). Recording stops at max_bytes."""
        self._client.start_timeline(_os.fspath(path), int(max_bytes))

    def stop_timeline(self):
        """Ends the timeline's file; calls still in flight are left out."""
        self._client.stop_timeline()

    def close(self):
        """Gives the session back (also on garbage collection)."""
        self._client.close()

    @property
    def closed(self):
        return self._client.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if self.closed:
            return "<harrier.Client closed>"
        return (f"<harrier.Client rank={self.rank}/{self.num_workers} shards={self.num_shards} "
                f"clock={self.current_clock}>")


class Scheduler:
    """The comm scheduler (worker/comm_scheduler.h) over numpy parameter
    buffers: wait-free backprop, fusion, partitioning, priority, credits.

    tensors: [(name, float32 array)] in forward order (index = priority);
    the arrays' values are the initial values and pulled parameters are
    written into them, so they must stay alive (the scheduler keeps them).
    techniques: "plain", "wfbp", "fusion", "priority", "all", or "a+b".
    forward_order_tail: with priority under BSP with several workers, the
    share of a step's push bytes (the front of the model) that goes last,
    front first; about 1 - backward time / communication time, the same on
    every worker (0: off). "measure": every worker times its step 1 and the
    workers average their estimates through the shards, so all plan the
    same tail from step 2 (every worker must say "measure"); stats() then
    gives it as forward_order_tail, this worker's own estimate as
    measured_forward_order_tail.
    """

    def __init__(self, client, tensors, techniques="all", fusion_bytes=0, partition_bytes=0,
                 max_inflight_bytes=0, wait_timeout=120.0, forward_order_tail=0.0):
        measure = isinstance(forward_order_tail, str)
        if measure and forward_order_tail != "measure":
            raise _bad(f"forward_order_tail={forward_order_tail!r}: want a fraction in [0, 1] "
                       f"or 'measure'")
        names, shapes, arrays = [], [], []
        for name, array in tensors:
            array = _writable(array, f"scheduler tensor '{name}'")
            names.append(name)
            shapes.append(list(array.shape))
            arrays.append(array)
        self._scheduler = _harrier.Scheduler(client._client, names, shapes, arrays, techniques,
                                             int(fusion_bytes), int(partition_bytes),
                                             int(max_inflight_bytes),
                                             _duration(wait_timeout, "wait_timeout"),
                                             0.0 if measure else float(forward_order_tail),
                                             measure)
        self._client = client
        self._sizes = [a.size for a in arrays]
        for name, shape in zip(names, shapes):
            client._shapes[name] = tuple(shape)

    def wait_parameters(self, index):
        """Returns once tensor `index`'s buffer holds this step's parameters."""
        self._scheduler.wait_parameters(index)

    def gradient_ready(self, index, gradient):
        """Tensor `index`'s gradient: borrowed (kept alive, must not change)
        until the next wait_parameters(index)."""
        if not 0 <= index < len(self._sizes):
            raise OutOfRangeError(f"tensor index {index} is not in [0, {len(self._sizes)})",
                                  "OUT_OF_RANGE", 11)
        grad = _readable(gradient, "gradient_ready")
        if grad.size != self._sizes[index]:
            raise _bad(f"gradient_ready({index}): {grad.size} elements, the tensor has "
                       f"{self._sizes[index]}")
        self._scheduler.gradient_ready(index, grad)

    def end_backward(self):
        """Every gradient of this step was given; the step advances."""
        self._scheduler.end_backward()

    def drain(self):
        """Waits for every call in flight (after the last step)."""
        self._scheduler.drain()

    def refresh(self):
        """Pulls every tensor again at the current step (after drain)."""
        self._scheduler.refresh()

    def stats(self):
        return self._scheduler.stats()

    def close(self):
        self._scheduler.close()
