"""Sparse tables from Python against real shards: the binding's calls with
exact values under BSP over 2 shards and 2 worker processes;
harrier.torch.Embedding and EmbeddingBag against torch.nn.functional on the
pulled rows, and after backward against plain PyTorch (sparse SGD, a
manual Adagrad); an EmbeddingBag + Linear model trained by 2 workers equal
to one PyTorch process on the whole batches; several tables in one
operation (pull_rows_many, push_rows_many, EmbeddingBagCollection); the
single-process table (no shards) equal to the shards bit for bit; refusals
of wrong input."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.nn.functional as F

import harrier
import harrier.torch as hvd
from harrier.sparse_rows import SparseRows
from harrier_testing import Cluster, main

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "sparse_worker.py")
sys.path.insert(0, HERE)
import sparse_worker  # noqa: E402

IDS = torch.tensor([5, -9, 5, 1 << 62, 77, -9, 5, 0], dtype=torch.int64)


def run_workers(cluster, scenario, workers=2, timeout=120, **flags):
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    processes, outs = [], []
    for rank in range(workers):
        env = dict(os.environ)
        env.update(HARRIER_SERVERS=",".join(cluster.servers), HARRIER_RANK=str(rank),
                   HARRIER_NUM_WORKERS=str(workers), HARRIER_LOCAL_RANK=str(rank),
                   HARRIER_LOCAL_SIZE=str(workers), OMP_NUM_THREADS="1")
        out = os.path.join(directory, f"worker{rank}.npz")
        args = [sys.executable, WORKER, f"--scenario={scenario}", f"--out={out}"]
        args += [f"--{k}={v}" for k, v in flags.items()]
        processes.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
        outs.append(out)
    results = []
    for rank, p in enumerate(processes):
        try:
            output, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in processes:
                q.kill()
            raise AssertionError(f"worker {rank} did not finish within {timeout} s")
        if p.returncode != 0:
            raise AssertionError(f"worker {rank} exited {p.returncode}:\n{output.decode()[-3000:]}")
        results.append(dict(np.load(outs[rank], allow_pickle=False)))
    return results


class WorkerProcessTest(unittest.TestCase):
    def test_binding_bsp_two_shards_two_workers_exact(self):
        steps, workers = 6, 2
        with Cluster(shards=2, workers=workers, sync="bsp") as cluster:
            results = run_workers(cluster, "binding", steps=steps)
        dim = sparse_worker.DIM
        for rank, r in enumerate(results):
            ids = r["ids"]
            # Per step, each row moves by minus the average of the workers'
            # gradients (summed over a worker's repeats; lr 1, rows from 0).
            per_step = np.zeros((len(ids), dim), np.float32)
            for other in range(workers):
                theirs = sparse_worker.binding_ids(other)
                g = sparse_worker.binding_gradient(other, theirs)
                for i, row_id in enumerate(ids):
                    per_step[i] += g[theirs == row_id].sum(axis=0)
            per_step /= workers
            for step in range(steps):
                np.testing.assert_array_equal(r["pulled"][step], -step * per_step,
                                              err_msg=f"rank {rank} step {step}")
            np.testing.assert_array_equal(r["final"], -steps * per_step, err_msg=f"rank {rank}")
            self.assertEqual(int(r["clock"]), steps)
            # 12 ids asked per pull, 11 distinct: the repeat never left.
            self.assertEqual(int(r["ids_requested"]), 12 * (steps + 1))
            self.assertEqual(int(r["rows_pulled"]), 11 * (steps + 1))
            self.assertEqual(int(r["rows_pushed"]), 11 * steps)

    def test_model_two_workers_equals_one_pytorch_process(self):
        steps, batch, lr = 4, 8, 0.5
        with Cluster(shards=2, workers=2, sync="bsp") as cluster:
            results = run_workers(cluster, "model", steps=steps, batch=batch, lr=lr)
        vocabulary, data = sparse_worker.model_data(steps, batch)
        self.assertEqual(len(np.unique(vocabulary)), len(vocabulary))
        # One process, the whole batches: a dense nn.EmbeddingBag holding
        # the table's initial rows, sparse gradients, torch's SGD.
        initial = SparseRows("bag", sparse_worker.DIM, init_scale=0.5, seed=7).initial_rows(
            vocabulary)
        bag = torch.nn.EmbeddingBag(len(vocabulary), sparse_worker.DIM, mode="mean",
                                    sparse=True)
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(initial))
        fc = sparse_worker.linear()
        optimizer = torch.optim.SGD(list(bag.parameters()) + list(fc.parameters()), lr=lr)
        position = {int(v): k for k, v in enumerate(vocabulary)}
        losses = []
        for ids, offsets, labels in data:
            index = torch.tensor([position[int(i)] for i in ids])
            optimizer.zero_grad()
            loss = F.cross_entropy(fc(torch.tanh(bag(index, torch.from_numpy(offsets)))),
                                   torch.from_numpy(labels))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        for rank, r in enumerate(results):
            self.assertEqual(int(r["clock"]), steps)  # the no_grad forwards pushed nothing
            np.testing.assert_allclose(r["rows"], bag.weight.detach().numpy(), rtol=0,
                                       atol=2e-6, err_msg=f"rank {rank} rows")
            np.testing.assert_allclose(r["weight"], fc.weight.detach().numpy(), rtol=0,
                                       atol=2e-6, err_msg=f"rank {rank} weight")
            np.testing.assert_allclose(r["bias"], fc.bias.detach().numpy(), rtol=0, atol=2e-6)
        # Equal halves: the mean of the ranks' losses is the whole batch's.
        np.testing.assert_allclose((results[0]["losses"] + results[1]["losses"]) / 2, losses,
                                   rtol=0, atol=2e-6)
        # It trained: the rows moved.
        self.assertGreater(np.abs(results[0]["rows"] - initial).max(), 1e-3)


class OneWorkerTest(unittest.TestCase):
    """harrier.torch in this process, joined to 2 shards of a 1-worker job
    (a cluster per test: a job that was left is gone)."""

    def setUp(self):
        self.cluster = Cluster(shards=2, workers=1, sync="bsp")
        # A job of many tables keeps more calls in flight (passed through
        # to the C++ client).
        hvd.init(servers=self.cluster.servers, rpc_timeout=30.0, max_calls_in_flight=16)
        self.client = hvd._job.client

    def tearDown(self):
        hvd.shutdown()
        self.cluster.close()

    def rows(self, name, ids):
        return torch.from_numpy(self.client.pull_rows(name, ids))

    def test_forward_equals_torch_functional_on_the_pulled_rows(self):
        embedding = hvd.Embedding("tokens", 6, init_scale=0.5, seed=1)
        distinct = torch.unique(IDS)
        weight = self.rows("tokens", distinct)
        index = torch.searchsorted(distinct, IDS)
        out = embedding(IDS.reshape(2, 4))
        self.assertEqual(out.shape, (2, 4, 6))
        self.assertTrue(torch.equal(out, F.embedding(index.reshape(2, 4), weight)))
        small = torch.tensor([5, -9, 77, 5])
        self.assertTrue(torch.equal(embedding(small.to(torch.int32)), embedding(small)))
        offsets = torch.tensor([0, 3, 3, 7])  # an empty bag too
        weights = torch.linspace(0.5, 2.0, len(IDS))
        for mode in ("mean", "sum", "max"):
            bag = hvd.EmbeddingBag("tokens", 6, mode=mode, init_scale=0.5, seed=1)
            self.assertTrue(torch.equal(bag(IDS, offsets),
                                        F.embedding_bag(index, weight, offsets, mode=mode)), mode)
            self.assertTrue(torch.equal(bag(IDS.reshape(2, 4)),
                                        F.embedding_bag(index.reshape(2, 4), weight, mode=mode)))
        bag = hvd.EmbeddingBag("tokens", 6, mode="sum", init_scale=0.5, seed=1)
        self.assertTrue(torch.equal(bag(IDS, offsets, per_sample_weights=weights),
                                    F.embedding_bag(index, weight, offsets, mode="sum",
                                                    per_sample_weights=weights)))
        # None of these had a backward: nothing pushed, the clock is 0.
        self.assertEqual(self.client.tensor_clock("tokens"), 0)
        self.assertEqual(embedding.stats()["rows_pushed"], 0)

    def test_one_sgd_step_equals_torch_sparse_sgd(self):
        lr = 0.3
        bag = hvd.EmbeddingBag("sgd", 5, mode="mean", lr=lr, init_scale=0.5, seed=2)
        distinct = torch.unique(IDS)
        index = torch.searchsorted(distinct, IDS)
        offsets = torch.tensor([0, 2, 5])
        target = torch.linspace(-1, 1, 15).reshape(3, 5)
        reference = torch.nn.EmbeddingBag(len(distinct), 5, mode="mean", sparse=True)
        with torch.no_grad():
            reference.weight.copy_(self.rows("sgd", distinct))
        optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
        ((reference(index, offsets) - target) ** 2).sum().backward()
        optimizer.step()
        ((bag(IDS, offsets) - target) ** 2).sum().backward()
        bag.synchronize()
        self.assertEqual(self.client.tensor_clock("sgd"), 1)
        np.testing.assert_allclose(self.rows("sgd", distinct), reference.weight.detach(),
                                   rtol=0, atol=1e-6)
        # The next forward (after its push) sees the stepped rows.
        with torch.no_grad():
            self.assertTrue(torch.allclose(bag(IDS, offsets), reference(index, offsets),
                                           rtol=0, atol=1e-6))

    def test_adagrad_steps_equal_a_manual_reference(self):
        lr, accumulator, eps = 0.1, 0.1, 1e-8
        embedding = hvd.Embedding("adagrad", 3, optimizer="adagrad", lr=lr,
                                  initial_accumulator=accumulator, init_scale=0.2, seed=4)
        distinct = torch.unique(IDS)
        index = torch.searchsorted(distinct, IDS)
        value = self.rows("adagrad", distinct).clone()
        state = torch.full_like(value, accumulator)
        for step in range(3):
            scale = torch.arange(1.0, len(IDS) + 1)[:, None] * (step + 1)
            (embedding(IDS) * scale).sin().sum().backward()
            w = value.clone().requires_grad_(True)
            (F.embedding(index, w) * scale).sin().sum().backward()
            state += w.grad * w.grad
            value -= lr * w.grad / (state.sqrt() + eps)
        np.testing.assert_allclose(self.rows("adagrad", distinct), value, rtol=0, atol=1e-6)
        self.assertEqual(self.client.tensor_clock("adagrad"), 3)

    def test_padding_idx_max_norm_and_scale_grad_by_freq_as_torch(self):
        distinct = torch.unique(IDS)
        index = torch.searchsorted(distinct, IDS)
        pad = int((distinct == 0).nonzero())  # IDS holds id 0 once
        # padding_idx: id 0 looks up zeros, and is neither pushed nor stepped.
        embedding = hvd.Embedding("pad", 4, lr=1.0, init_scale=0.5, seed=3, padding_idx=0)
        before = self.rows("pad", distinct)
        weight = before.clone()
        weight[pad] = 0
        reference = torch.nn.Embedding(len(distinct), 4, padding_idx=pad)
        with torch.no_grad():
            reference.weight.copy_(weight)
        scale = torch.arange(1.0, len(IDS) + 1)[:, None]
        out = embedding(IDS)
        self.assertTrue(torch.equal(out, reference(index)))
        self.assertTrue(torch.equal(out[IDS == 0], torch.zeros(1, 4)))
        (out * scale).sin().sum().backward()
        (reference(index) * scale).sin().sum().backward()
        with torch.no_grad():
            reference.weight -= reference.weight.grad
        embedding.synchronize()
        after = self.rows("pad", distinct)
        self.assertTrue(torch.equal(after[pad], before[pad]))  # its initial row, untouched
        keep = torch.arange(len(distinct)) != pad
        np.testing.assert_allclose(after[keep], reference.weight.detach()[keep], rtol=0, atol=1e-6)
        self.assertEqual(embedding.stats()["rows_pushed"], len(distinct) - 1)
        # A batch of padding alone: zeros, and its backward still advances the clock.
        only = embedding(torch.zeros(3, dtype=torch.int64))
        self.assertTrue(torch.equal(only, torch.zeros(3, 4)))
        only.sum().backward()
        embedding.synchronize()
        self.assertEqual(self.client.tensor_clock("pad"), 2)
        # EmbeddingBag leaves the padding id out of its bag's mean.
        offsets = torch.tensor([0, 3, 6])
        bag = hvd.EmbeddingBag("pad", 4, mode="mean", lr=1.0, init_scale=0.5, seed=3,
                               padding_idx=0)
        weight = self.rows("pad", distinct)
        weight[pad] = 0
        with torch.no_grad():
            self.assertTrue(torch.allclose(
                bag(IDS, offsets),
                F.embedding_bag(index, weight, offsets, mode="mean", padding_idx=pad),
                rtol=0, atol=1e-7))
        # max_norm rescales the looked-up rows as torch does.
        norm = hvd.Embedding("norm", 4, init_scale=0.5, seed=5, max_norm=0.3)
        weight = self.rows("norm", distinct)
        out = norm(IDS)
        self.assertTrue(torch.allclose(out, F.embedding(index, weight.clone(), max_norm=0.3),
                                       rtol=0, atol=1e-7))
        self.assertLessEqual(float(out.norm(dim=1).max()), 0.3 + 1e-6)
        self.assertGreater(float(weight.norm(dim=1).max()), 0.3)  # so something was rescaled
        # scale_grad_by_freq: a repeated id's gradient divided by its count.
        freq = hvd.Embedding("freq", 3, lr=1.0, init_scale=0.5, seed=6, scale_grad_by_freq=True)
        reference = torch.nn.Embedding(len(distinct), 3, scale_grad_by_freq=True)
        with torch.no_grad():
            reference.weight.copy_(self.rows("freq", distinct))
        (freq(IDS) * scale[:, :1]).sum().backward()
        (reference(index) * scale[:, :1]).sum().backward()
        with torch.no_grad():
            reference.weight -= reference.weight.grad
        freq.synchronize()
        np.testing.assert_allclose(self.rows("freq", distinct), reference.weight.detach(),
                                   rtol=0, atol=1e-6)
        self.assertIn("padding_idx=0", repr(embedding))

    def test_many_tables_in_one_operation(self):
        for name, dim in (("m1", 4), ("m2", 3)):
            self.client.register_sparse(name, dim, lr=1.0, init_scale=0.5, seed=7)
        ids = {"m1": np.array([3, -1, 3, 1 << 40]), "m2": np.array([8, 9])}
        rows = self.client.pull_rows_many(ids)
        self.assertEqual(sorted(rows), ["m1", "m2"])
        for name in ids:
            np.testing.assert_array_equal(rows[name], self.client.pull_rows(name, ids[name]))
        grads = {name: np.ones((len(ids[name]), self.client.sparse_dim(name)), np.float32)
                 for name in ids}
        self.client.push_rows_many({name: (ids[name], grads[name]) for name in ids})
        after = self.client.pull_rows_many_async(ids).wait(30.0)
        np.testing.assert_allclose(after["m1"][1], rows["m1"][1] - 1, rtol=0, atol=1e-6)
        np.testing.assert_allclose(after["m1"][0], rows["m1"][0] - 2, rtol=0, atol=1e-6)  # twice
        np.testing.assert_allclose(after["m2"], rows["m2"] - 1, rtol=0, atol=1e-6)
        # A bad part refuses the whole push: no clock moves.
        with self.assertRaisesRegex(harrier.InvalidArgumentError, "m2"):
            self.client.push_rows_many({"m1": (ids["m1"], grads["m1"]),
                                        "m2": (ids["m2"], grads["m2"][:1])})
        self.assertEqual((self.client.tensor_clock("m1"), self.client.tensor_clock("m2")), (1, 1))

    def test_embedding_bag_collection_is_one_operation_and_steps_as_torch(self):
        lr = 0.5
        collection = hvd.EmbeddingBagCollection({"c.user": 4, "c.item": 3, "c.unused": 2},
                                                mode="sum", lr=lr, init_scale=0.5, seed=8)
        self.assertEqual(collection.names, ["c.user", "c.item", "c.unused"])
        user = torch.tensor([[5, 6], [5, -2]])
        item = (torch.tensor([1, 2, 1, 9]), torch.tensor([0, 1]))
        unused = torch.tensor([[11]])
        references = {}
        for name, input in (("c.user", user), ("c.item", item[0])):
            distinct = torch.unique(input)
            module = torch.nn.EmbeddingBag(len(distinct), self.client.sparse_dim(name), mode="sum")
            with torch.no_grad():
                module.weight.copy_(self.rows(name, distinct))
            references[name] = (distinct, module)
        # Only the operation over all tables may be used.
        client = self.client
        def refuse(*args, **kwargs):
            raise AssertionError("a table was pulled or pushed on its own")
        saved = {n: getattr(client, n) for n in ("pull_rows", "pull_rows_async",
                                                   "push_rows", "push_rows_async")}
        try:
            for n in saved:
                setattr(client, n, refuse)
            out = collection({"c.user": user, "c.item": item, "c.unused": unused})
            loss = (out["c.user"] ** 2).sum() + out["c.item"].sin().sum()
            loss.backward()
            collection.synchronize()
        finally:
            for n, f in saved.items():
                setattr(client, n, f)
        distinct, module = references["c.user"]
        expected_user = module(torch.searchsorted(distinct, user))
        distinct_i, module_i = references["c.item"]
        expected_item = module_i(torch.searchsorted(distinct_i, item[0]), item[1])
        self.assertTrue(torch.allclose(out["c.user"], expected_user, rtol=0, atol=1e-6))
        self.assertTrue(torch.allclose(out["c.item"], expected_item, rtol=0, atol=1e-6))
        ((expected_user ** 2).sum() + expected_item.sin().sum()).backward()
        for name, (distinct, module) in references.items():
            with torch.no_grad():
                module.weight -= lr * module.weight.grad
            np.testing.assert_allclose(self.rows(name, distinct), module.weight.detach(),
                                       rtol=0, atol=1e-5)
        # Every table's clock moved once, the unused one's too (a zero push).
        self.assertEqual([self.client.tensor_clock(n) for n in collection.names], [1, 1, 1])
        with self.assertRaisesRegex(harrier.InvalidArgumentError, "missing"):
            collection({"c.user": user, "c.item": item})

    def test_calls_in_flight_must_be_positive(self):
        with self.assertRaisesRegex(harrier.InvalidArgumentError, "max_calls_in_flight"):
            harrier.Client(self.cluster.servers, max_calls_in_flight=0)

    def test_errors(self):
        c = self.client
        c.register_sparse("e", 4)
        ids = np.array([1, 2, 3], dtype=np.int64)
        cases = [
            (lambda: c.pull_rows("e", ids.astype(np.float64)), harrier.InvalidArgumentError,
             "pull_rows 'e' ids: expected integer ids \\(int64\\), got dtype float64"),
            (lambda: c.pull_rows("e", ids.view(np.uint64)), harrier.InvalidArgumentError,
             "uint64 ids; give int64"),
            (lambda: c.pull_rows("e", ids, np.zeros((3, 4), np.float64)),
             harrier.InvalidArgumentError, "expected a writable C-contiguous float32 array"),
            (lambda: c.pull_rows("e", ids, np.zeros((3, 8), np.float32)[:, ::2]),
             harrier.InvalidArgumentError, "not contiguous"),
            (lambda: c.pull_rows("e", ids, np.zeros((3, 3), np.float32)),
             harrier.InvalidArgumentError, "out has 9 elements, 3 ids need 12 \\(shape \\(3, 4\\)\\)"),
            (lambda: c.push_rows("e", ids, np.zeros((2, 4), np.float32)),
             harrier.InvalidArgumentError, "gradients have 8 elements, 3 ids need 12"),
            (lambda: c.pull_rows("nope", ids), harrier.NotFoundError,
             "sparse table 'nope' is not registered"),
            (lambda: c.register_sparse("bad", 0), harrier.InvalidArgumentError,
             "dim must be an int in \\[1, 65536\\]"),
            (lambda: c.register_sparse("bad", 4, optimizer="lamb"), harrier.InvalidArgumentError,
             "optimizer 'lamb' is not one of sgd, adagrad, rowwise_adagrad, adam"),
            (lambda: c.register_sparse("bad", 4, wire_dtype="int8"),
             harrier.InvalidArgumentError, "wire_dtype 'int8' is not float32, fp16 or bf16"),
            (lambda: c.register_sparse("e", 4), harrier.AlreadyExistsError,
             "already registered by this worker"),
            # The extension itself refuses what the package would convert.
            (lambda: c._client.pull_rows("e", ids.astype(np.int32), np.zeros((3, 4), np.float32)),
             harrier.InvalidArgumentError, "expected int64 ids, got format 'i'"),
            (lambda: c._client.push_rows("e", np.arange(6)[::2], np.zeros((3, 4), np.float32)),
             harrier.InvalidArgumentError, "ids are not C-contiguous"),
            (lambda: c._client.push_rows("e", ids, np.zeros((3, 4), np.float64)),
             harrier.InvalidArgumentError, "expected float32 elements"),
            (lambda: hvd.Embedding("e2", 4)(IDS.float()), harrier.InvalidArgumentError,
             "Embedding 'e2': ids must be int64 \\(or int32\\), got torch.float32"),
            (lambda: hvd.Embedding("e", 8), harrier.InvalidArgumentError,
             "sparse table 'e': dim, lr differ from its first use|registered again"),
            (lambda: hvd.EmbeddingBag("e3", 4, mode="median"), harrier.InvalidArgumentError,
             "mode must be 'mean', 'sum' or 'max'"),
            (lambda: hvd.Embedding("e4", 4, momentum=0.9), TypeError,
             "unknown option\\(s\\) momentum"),
        ]

        class DeviceArray:  # what a CUDA tensor or CuPy array shows
            __cuda_array_interface__ = {"shape": (3, 4), "typestr": "<f4",
                                        "data": (4096, False), "version": 2, "strides": None}

        cases.append((lambda: c._client.pull_rows("e", ids, DeviceArray()),
                      harrier.InvalidArgumentError, "a CUDA array; sparse tables take host"))
        for call, error, message in cases:
            with self.assertRaisesRegex(error, message):
                call()
        # Nothing refused was pushed.
        self.assertEqual(c.tensor_clock("e"), 0)

    def test_modules_of_one_name_share_the_table_and_a_copy_finds_it(self):
        import copy
        first = hvd.Embedding("shared", 4, lr=1.0, init_scale=0.0)
        second = hvd.Embedding("shared", 4, lr=1.0, init_scale=0.0)
        first(torch.tensor([1, 2])).sum().backward()
        copied = copy.deepcopy(second)
        np.testing.assert_array_equal(copied(torch.tensor([1, 2, 3])).detach(),
                                      [[-1.0] * 4, [-1.0] * 4, [0.0] * 4])
        self.assertEqual(self.client.tensor_clock("shared"), 1)


def train_four_tables(steps=3):
    """A few steps of a model with one table per optimizer; returns every
    table's rows of the ids used, after the last step."""
    tables = {name: hvd.Embedding(f"t_{name}", 5, optimizer=name, lr=0.05, init_scale=0.3,
                                  seed=9, initial_accumulator=0.1)
              for name in ("sgd", "adagrad", "rowwise_adagrad", "adam")}
    collection = hvd.EmbeddingBagCollection({"bag_a": 3, "bag_b": 2}, optimizer="adagrad",
                                            lr=0.05, init_scale=0.3, seed=9,
                                            initial_accumulator=0.1)
    generator = torch.Generator().manual_seed(1)
    vocabulary = torch.randint(-(1 << 40), 1 << 40, (12,), generator=generator)
    for step in range(steps):
        ids = vocabulary[torch.randint(0, 12, (2, 7), generator=generator)]
        loss = sum(((e(ids) - 0.1 * step) ** 2).mean() for e in tables.values())
        bags = collection({"bag_a": ids, "bag_b": ids[:, :3]})
        loss = loss + (bags["bag_a"] ** 2).mean() + bags["bag_b"].sum()
        loss.backward()
    with torch.no_grad():
        out = {name: e(vocabulary).numpy() for name, e in tables.items()}
        column = vocabulary.reshape(-1, 1)
        out.update({name: rows.numpy() for name, rows in
                    collection({"bag_a": column, "bag_b": column}).items()})
        return out


class SingleProcessTest(unittest.TestCase):
    def test_no_shards_gives_the_shards_numbers(self):
        self.assertNotIn("HARRIER_SERVERS", os.environ)
        with Cluster(shards=2, workers=1, sync="bsp") as cluster:
            hvd.init(servers=cluster.servers)
            try:
                sharded = train_four_tables()
            finally:
                hvd.shutdown()
        hvd.init()  # no shards: the tables live in this process
        try:
            self.assertIsInstance(hvd._job.client, hvd._LocalClient)
            local = train_four_tables()
            self.assertEqual(hvd._job.client.tensor_clock("t_adam"), 3)
        finally:
            hvd.shutdown()
        for name in sharded:
            np.testing.assert_array_equal(local[name], sharded[name], err_msg=name)

    def test_embedding_needs_init_before_its_first_forward(self):
        embedding = hvd.Embedding("later", 4)  # before init(): registered on first use
        with self.assertRaisesRegex(harrier.InvalidArgumentError,
                                    "Embedding 'later': call harrier.torch.init\\(\\) first"):
            embedding(torch.tensor([1]))
        hvd.init()
        try:
            self.assertEqual(embedding(torch.tensor([1, 1])).shape, (2, 4))
        finally:
            hvd.shutdown()


if __name__ == "__main__":
    main()
