"""A sparse table held in this process, with the shards' arithmetic: what
harrier.torch's Embedding and EmbeddingBag use in a job of one process
without shards (`python3 train.py`), so that such a run gives the numbers
a run on shards gives.

The same as server/sparse_rows.cc, operation for operation in float32: the
initializer (a row is uniform in [-init_scale, init_scale), a function of
seed, table name and id: splitmix64 of the FNV-1a name hash, the mixed id
and the element index), the per-row optimizers sgd, adagrad (an accumulator
per element), rowwise_adagrad (one per row, the mean of the squared
gradient) and adam (bias-corrected by the row's own step count), and
admission (admit_after pushes counted exactly here where the shards keep a
count-min sketch, then the same draw against admit_probability). Not here:
max_rows, eviction and ttl_steps (one process keeps every row),
wire_dtype, the hot-row cache and sync (nothing goes over a wire). numpy
only; not thread-safe (the caller locks).
"""

import numpy as _np

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")


def _splitmix(x):
    """splitmix64's finalizer of a Python int (wrapping at 2**64)."""
    x = (x + _GOLDEN) & _MASK
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK
    return x ^ (x >> 31)


def _splitmix_array(x):
    """The same over a uint64 numpy array (numpy's uint64 arithmetic wraps)."""
    x = x + _np.uint64(_GOLDEN)
    x = (x ^ (x >> _np.uint64(30))) * _np.uint64(_MUL1)
    x = (x ^ (x >> _np.uint64(27))) * _np.uint64(_MUL2)
    return x ^ (x >> _np.uint64(31))


def _name_hash(name, seed):
    h = 0xCBF29CE484222325  # FNV-1a over the name's UTF-8 bytes, then mixed
    for byte in name.encode("utf-8"):
        h ^= byte
        h = (h * 0x100000001B3) & _MASK
    return _splitmix(h) ^ _splitmix(seed & _MASK)


def _unit(h):
    """Uniform in [0, 1) from the top 24 bits of each hash (float32, exact)."""
    return (h >> _np.uint64(40)).astype(_np.float32) * _np.float32(1.0 / 16777216.0)


class SparseRows:
    """The rows of one table: int64 id -> `dim` float32 values and the
    optimizer's state. Options are register_sparse's; the ones that have no
    meaning in one process (max_rows, eviction, ...) are accepted and not
    used."""

    def __init__(self, name, dim, optimizer="sgd", lr=0.01, beta1=0.9, beta2=0.999,
                 epsilon=1e-8, initial_accumulator=0.0, init_scale=0.01, seed=0,
                 admit_after=0, admit_probability=1.0, **unused):
        optimizer = optimizer or "sgd"
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"sparse table '{name}': optimizer '{optimizer}' is not one of "
                             f"{', '.join(OPTIMIZERS)}")
        for field, value, low, high in (("lr", lr, 0, 1e6), ("beta1", beta1, 0, 1),
                                        ("beta2", beta2, 0, 1), ("epsilon", epsilon, 0, 1),
                                        ("initial_accumulator", initial_accumulator, 0, 1e6),
                                        ("init_scale", init_scale, 0, 1e6),
                                        ("admit_probability", admit_probability, 0, 1)):
            if not low <= float(value) <= high:  # also NaN
                raise ValueError(f"sparse table '{name}': {field} {value} outside "
                                 f"[{low}, {high}]")
        if optimizer == "adam" and (beta1 >= 1 or beta2 >= 1):
            raise ValueError("sparse table: adam needs beta1 and beta2 below 1")
        if optimizer != "sgd" and not epsilon > 0:
            raise ValueError(f"sparse table: optimizer '{optimizer}' needs epsilon above 0")
        self.name = name
        self.dim = int(dim)
        self.optimizer = optimizer
        f32 = _np.float32
        self.lr, self.beta1, self.beta2 = f32(lr), f32(beta1), f32(beta2)
        self.epsilon, self.init_scale = f32(epsilon), f32(init_scale)
        self.initial_accumulator = f32(initial_accumulator)
        self.admit_after = int(admit_after)
        self.admit_probability = f32(admit_probability) if admit_probability > 0 else f32(1)
        self.name_hash = _np.uint64(_name_hash(name, int(seed)))
        self.state_floats = {"sgd": 0, "adagrad": self.dim, "rowwise_adagrad": 1,
                             "adam": 2 * self.dim}[optimizer]
        self.index = {}  # id -> slot
        self.values = _np.empty((0, self.dim), _np.float32)
        self.state = _np.empty((0, self.state_floats), _np.float32)
        self.steps = _np.empty(0, _np.uint32)
        self.used = 0     # slots taken (the arrays' first `used` rows)
        self.counts = {}  # pushes of ids not admitted yet

    def initial_rows(self, ids):
        """The initializer's rows of `ids` (int64 array): (len(ids), dim)."""
        mixed = _splitmix_array(_np.asarray(ids, _np.int64).view(_np.uint64))
        base = self.name_hash ^ mixed
        h = _splitmix_array(base[:, None] + _np.arange(self.dim, dtype=_np.uint64)[None, :])
        return (_np.float32(2.0) * _unit(h) - _np.float32(1.0)) * self.init_scale

    def _at_once(self):
        return self.admit_after <= 1 and self.admit_probability >= 1

    def _store(self, ids):
        """New slots for `ids` (none stored yet), from the initializer."""
        first, need = self.used, self.used + len(ids)
        if need > len(self.values):
            capacity = max(need, 2 * len(self.values), 64)
            for attribute in ("values", "state", "steps"):
                old = getattr(self, attribute)
                grown = _np.empty((capacity,) + old.shape[1:], old.dtype)
                grown[:first] = old[:first]
                setattr(self, attribute, grown)
        self.values[first:need] = self.initial_rows(ids)
        if self.state_floats:
            self.state[first:need] = (_np.float32(0) if self.optimizer == "adam"
                                      else self.initial_accumulator)
        self.steps[first:need] = 0
        self.used = need
        for k, i in enumerate(ids.tolist()):
            self.index[i] = first + k
        return _np.arange(first, need)

    def _slots(self, ids):
        return _np.fromiter((self.index.get(i, -1) for i in ids.tolist()), _np.int64,
                            count=len(ids))

    def pull(self, ids):
        """The rows of distinct `ids` (int64): stored rows, else the
        initializer's (stored too when admission lets ids in at once)."""
        ids = _np.asarray(ids, _np.int64)
        slots = self._slots(ids)
        missing = slots < 0
        if missing.any() and self._at_once():
            slots[missing] = self._store(ids[missing])
            missing[:] = False
        out = _np.empty((len(ids), self.dim), _np.float32)
        out[~missing] = self.values[slots[~missing]]
        if missing.any():
            out[missing] = self.initial_rows(ids[missing])
        return out

    def _admit(self, i):
        if self._at_once():
            return True
        # Occurrences are counted whenever admission is not immediate, so the
        # draw below is a new one on each push of an id not yet admitted.
        count = min(self.counts.get(i, 0) + 1, 0xFFFF)
        self.counts[i] = count
        if count < self.admit_after:
            return False
        if self.admit_probability >= 1:
            return True
        h = _np.uint64(_splitmix(i & _MASK)) ^ self.name_hash ^ _np.uint64(count << 32)
        return bool(_unit(_splitmix_array(_np.array([h], _np.uint64)))[0] <
                    self.admit_probability)

    def push(self, ids, gradients, scale=1.0):
        """One optimizer step on the rows of distinct `ids` with `gradients`
        ((len(ids), dim) float32) x `scale`."""
        ids = _np.asarray(ids, _np.int64)
        g = _np.asarray(gradients, _np.float32).reshape(len(ids), self.dim)
        slots = self._slots(ids)
        new = _np.flatnonzero(slots < 0)
        if len(new):
            admitted = [k for k in new.tolist() if self._admit(int(ids[k]))]
            for k in admitted:
                self.counts.pop(int(ids[k]), None)
            if admitted:
                slots[admitted] = self._store(ids[admitted])
            keep = slots >= 0
            ids, g, slots = ids[keep], g[keep], slots[keep]
        if not len(slots):
            return
        self._step(slots, g, _np.float32(scale))

    def _step(self, slots, gradient, scale):
        f32 = _np.float32
        values = self.values[slots]
        lr = self.lr
        if self.optimizer == "sgd":
            values -= (lr * scale) * gradient
        elif self.optimizer == "adagrad":
            g = scale * gradient
            state = self.state[slots]
            state += g * g
            values -= (lr * g) / (_np.sqrt(state) + self.epsilon)
            self.state[slots] = state
        elif self.optimizer == "rowwise_adagrad":
            g = (scale * gradient).astype(_np.float64)
            squares = _np.zeros(len(slots), _np.float64)
            for j in range(self.dim):  # in element order, as the shard adds them
                squares += g[:, j] * g[:, j]
            state = self.state[slots]
            state[:, 0] += (squares / self.dim).astype(f32)
            step = lr / (_np.sqrt(state[:, 0]) + self.epsilon)
            values -= (step * scale)[:, None] * gradient
            self.state[slots] = state
        else:
            g = scale * gradient
            state = self.state[slots]
            m, v = state[:, :self.dim], state[:, self.dim:]
            t = self.steps[slots].astype(_np.float64) + 1.0
            correction1 = (1.0 - _np.power(_np.float64(self.beta1), t)).astype(f32)[:, None]
            correction2 = (1.0 - _np.power(_np.float64(self.beta2), t)).astype(f32)[:, None]
            m[...] = self.beta1 * m + (f32(1) - self.beta1) * g
            v[...] = self.beta2 * v + ((f32(1) - self.beta2) * g) * g
            values -= (lr * (m / correction1)) / (_np.sqrt(v / correction2) + self.epsilon)
            self.state[slots] = state
        self.values[slots] = values
        self.steps[slots] += 1

    def __len__(self):
        return len(self.index)
