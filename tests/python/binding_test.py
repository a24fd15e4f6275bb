"""Every call of the harrier Python binding and its error paths, against
real shards on 127.0.0.1 (values checked exactly: integer parameters and
power-of-two gradients make the shards' SGD exact)."""

import collections
import contextlib
import gc
import io
import json
import os
import threading
import time
import unittest

import numpy as np
import torch

import harrier
from harrier_testing import Cluster, main

N = 1 << 20  # 4 MiB: four 1 MiB chunks over two shards
LR = 0.5


def initial():
    return (np.arange(N, dtype=np.float32) % 1000) - 500


def gradient(step):
    return np.full(N, 2.0 ** -step, dtype=np.float32) * np.where(np.arange(N) % 2 == 0, 1, -1).astype(np.float32)


class BindingTest(unittest.TestCase):
    # A cluster per test: a rank that has left is gone for its job.
    def setUp(self):
        self.cluster = Cluster(shards=2, workers=1, server_args=["--optimizer=sgd", f"--lr={LR}"])

    def tearDown(self):
        self.cluster.close()

    def client(self, **kwargs):
        kwargs.setdefault("chunk_bytes", 1 << 20)
        kwargs.setdefault("rpc_timeout", 20.0)
        kwargs.setdefault("connect_timeout", 10.0)
        return harrier.Client(servers=self.cluster.servers, **kwargs)

    def test_cuda_arrays_in_a_build_without_cuda(self):
        if harrier._harrier.built_with_cuda:
            self.skipTest("a CUDA build: tests/cuda/python_device_check.py covers it")

        class DeviceArray:  # what CuPy or a CUDA tensor shows
            __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (4096, False),
                                        "version": 2, "strides": None}

        with self.client() as c:
            c.register("w", (4,))
            for call in (lambda: c.push("w", DeviceArray()), lambda: c.pull("w", DeviceArray())):
                with self.assertRaisesRegex(harrier.FailedPreconditionError,
                                            "a CUDA array, but this Harrier module was built "
                                            "without CUDA"):
                    call()
            with self.assertRaisesRegex(harrier.FailedPreconditionError,
                                        "'d' in device memory, but this Harrier module was "
                                        "built without CUDA"):
                c.register("d", (4,), memory="device")

    def test_identity_and_sync(self):
        with self.assertRaisesRegex(harrier.FailedPreconditionError, "job 'other'"):
            self.client(job="other")
        with self.client(worker_name="python-worker") as c:
            self.assertEqual(c.rank, 0)
            self.assertEqual(c.num_workers, 1)
            self.assertEqual(c.num_shards, 2)
            # The default transport ("auto"): tcp, which shards serve by default.
            self.assertEqual(c.data_paths, ["tcp", "tcp"])
            self.assertEqual(c.chunk_bytes, 1 << 20)
            sync = dict(c.sync)
            self.assertAlmostEqual(sync.pop("momentum"), 0.9, places=6)  # --momentum's default
            # The shards' optimizer (--optimizer=sgd --lr=0.5) comes with the sync mode.
            self.assertEqual(sync, {"mode": "bsp", "staleness": 0, "local_steps": 1,
                                    "optimizer": "sgd", "lr": 0.5, "weight_decay": 0.0})
            self.assertEqual(c.current_clock, 0)
            self.assertEqual(c.clock(), 1)
            self.assertEqual(c.current_clock, 1)
            self.assertIn("rank=0/1", repr(c))
        self.assertTrue(c.closed)
        self.assertIn("closed", repr(c))

    def test_push_pull_values_exact(self):
        with self.client() as c:
            w0 = initial()
            c.register("exact", w0)
            self.assertEqual(c.shape("exact"), (N,))
            np.testing.assert_array_equal(c.pull("exact"), w0)
            expected = w0.copy()
            out = np.zeros(N, dtype=np.float32)
            for step in range(3):
                g = gradient(step)
                c.push("exact", g)
                c.clock()
                returned = c.pull("exact", out)
                self.assertIs(returned, out)  # written in place, no copy
                expected -= np.float32(LR) * g
                np.testing.assert_array_equal(out, expected)
            stats = c.stats()
            self.assertEqual(stats["bytes_pushed"], 3 * N * 4)
            self.assertGreaterEqual(stats["bytes_pulled"], 4 * N * 4)
            self.assertEqual(sum(stats["bytes_pushed_per_shard"]), stats["bytes_pushed"])
            self.assertEqual(sum(stats["bytes_pulled_per_shard"]), stats["bytes_pulled"])
            self.assertEqual(len(stats["bytes_pulled_per_shard"]), 2)
            # Not staging buffers: every reply went through a receive buffer.
            self.assertEqual(stats["bytes_landed_in_staging"], 0)
            self.assertGreaterEqual(stats["pushes"], 3)
            self.assertGreaterEqual(stats["pulls"], 4)
            for key in ("push_wait_s", "pull_wait_s", "last_min_clock"):
                self.assertIn(key, stats)

    def test_torch_tensors_zero_copy(self):
        with self.client() as c:
            w = torch.from_numpy(initial().reshape(1024, 1024).copy())
            c.register("torch", w)
            self.assertEqual(c.shape("torch"), (1024, 1024))
            out = torch.zeros(1024, 1024)
            pointer = out.data_ptr()
            self.assertIs(c.pull("torch", out), out)
            self.assertEqual(out.data_ptr(), pointer)
            self.assertTrue(torch.equal(out, w))
            g = torch.from_numpy(gradient(1).reshape(1024, 1024).copy()).requires_grad_()
            result = c.push_pull("torch", g, out)  # a tensor that requires grad is fine as input
            self.assertIs(result, out)
            self.assertTrue(torch.equal(out, w - LR * g.detach()))
            c.clock()

    def test_inputs_converted_outputs_strict(self):
        with self.client() as c:
            c.register("convert", (4, 8))
            np.testing.assert_array_equal(c.pull("convert"), np.zeros((4, 8), np.float32))
            # float64, non-contiguous and integer inputs are copied to float32.
            g64 = np.full((8, 4), 2.0).T  # float64, Fortran order
            c.push("convert", g64)
            c.clock()
            np.testing.assert_array_equal(c.pull("convert"), np.full((4, 8), -LR * 2, np.float32))
            c.push("convert", torch.ones(4, 8, dtype=torch.float64))
            c.clock()
            np.testing.assert_array_equal(c.pull("convert"), np.full((4, 8), -1.5, np.float32))
            before = c.pull("convert")
            for bad_out in (np.zeros((4, 8), np.float64), np.zeros((8, 8), np.float32)[:, ::2],
                            torch.zeros(8, 4).t(), torch.zeros(4, 8, dtype=torch.float16), [0.0] * 32):
                with self.assertRaises(harrier.InvalidArgumentError) as caught:
                    c.pull("convert", bad_out)
                self.assertIsInstance(caught.exception, ValueError)
                self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
            read_only = np.zeros((4, 8), np.float32)
            read_only.flags.writeable = False
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "read-only"):
                c.pull("convert", read_only)
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "complex|real"):
                c.push("convert", np.zeros(32, np.complex64))
            np.testing.assert_array_equal(c.pull("convert"), before)

    def test_bad_shape_refused_and_changes_nothing(self):
        with self.client() as c:
            c.register("shape", np.ones(100, np.float32))
            with self.assertRaises(harrier.InvalidArgumentError) as caught:
                c.push("shape", np.ones(99, np.float32))
            self.assertIsInstance(caught.exception, ValueError)
            self.assertIn("99 elements", caught.exception.message)
            with self.assertRaises(ValueError):
                c.pull("shape", np.zeros(101, np.float32))
            with self.assertRaises(ValueError):
                c.push_async("shape", np.ones(101, np.float32))
            # The C++ client's own check (not only the package's).
            with self.assertRaises(harrier.InvalidArgumentError):
                c._client.push("shape", np.ones(99, np.float32))
            # A second registration must agree on the shape.
            with self.assertRaises(harrier.InvalidArgumentError):
                c.register("shape", (10, 11))
            np.testing.assert_array_equal(c.pull("shape"), np.ones(100, np.float32))
            with self.assertRaises(harrier.InvalidArgumentError):
                c.register("negative", (3, -1))
            with self.assertRaises(harrier.InvalidArgumentError):
                c._client.register("", [3], None)

    def test_unregistered_name(self):
        with self.client() as c:
            with self.assertRaises(harrier.NotFoundError) as caught:
                c.pull("nobody")
            self.assertIsInstance(caught.exception, LookupError)
            with self.assertRaises(harrier.Error):
                c._client.push("nobody", np.ones(4, np.float32))

    def test_staging_buffers(self):
        # Pushed from the array itself (no send copy), pulled with the
        # check taken during the copy: the values are the same.
        with self.client() as c:
            w0 = initial()
            c.register("staged", w0, staging_buffers=True)
            g = gradient(1)
            c.push_async("staged", g).wait(20)
            c.clock()
            out = np.empty(N, np.float32)
            c.pull_async("staged", out).wait(20)
            np.testing.assert_array_equal(out, w0 - np.float32(LR) * g)
            both = np.empty(N, np.float32)
            c.push_pull_async("staged", g, both).wait(20)
            np.testing.assert_array_equal(both, w0 - np.float32(2 * LR) * g)

    def test_async_handles(self):
        with self.client() as c:
            w0 = initial()
            c.register("async", w0)
            g = gradient(2)
            handle = c.push_async("async", g)
            self.assertIsInstance(handle, harrier.Handle)
            self.assertFalse(handle.done)
            self.assertGreater(handle.id, 0)
            self.assertIsNone(handle.wait(timeout=20))
            self.assertTrue(handle.done)
            with self.assertRaises(harrier.NotFoundError):
                handle.wait()
            c.clock()
            out = np.empty(N, np.float32)
            pulled = c.pull_async("async", out).wait(timeout=20)
            self.assertIs(pulled, out)
            np.testing.assert_array_equal(out, w0 - np.float32(LR) * g)
            fresh = c.pull_async("async").wait(20)
            np.testing.assert_array_equal(fresh, out)
            both = c.push_pull_async("async", g).wait(20)
            np.testing.assert_array_equal(both, w0 - np.float32(2 * LR) * g)
            c.clock()
            # A piece at an explicit clock: chunk 1 only.
            piece = np.zeros(N, np.float32)
            c.pull_async("async", piece, clock=c.current_clock, first_chunk=1, num_chunks=1).wait(20)
            q = N // 4
            np.testing.assert_array_equal(piece[q:2 * q], both[q:2 * q])
            self.assertFalse(piece[:q].any() or piece[2 * q:].any())
            with self.assertRaises(harrier.InvalidArgumentError):
                c.pull_async("async", piece, first_chunk=9).wait(20)
            with self.assertRaises(harrier.InvalidArgumentError):
                handle = c.pull_async("async", piece)
                handle.wait(timeout=-1)
            handle.wait(20)

    def test_dropped_handle_waits_and_frees(self):
        with self.client() as c:
            c.register("dropped", initial())
            for _ in range(8):
                c.pull_async("dropped", np.empty(N, np.float32))  # dropped at once
            gc.collect()
            self.assertEqual(c._client.live_operations(), 0)
            h = c.push_async("dropped", gradient(0))
            del h  # the push still completes before its array is released
            c.clock()
            np.testing.assert_array_equal(c.pull("dropped"), initial() - np.float32(LR) * gradient(0))

    def test_barrier_leave_and_closed(self):
        c = self.client()
        c.register("leave", (16,))
        c.barrier("python-barrier")
        c.heartbeat()
        c.leave()
        with self.assertRaises(harrier.FailedPreconditionError):
            c.push("leave", np.ones(16, np.float32))
        c.close()
        c.close()  # idempotent
        with self.assertRaisesRegex(harrier.FailedPreconditionError, "closed"):
            c.pull("leave")
        with self.assertRaises(harrier.FailedPreconditionError):
            _ = c.rank

    def test_bad_options(self):
        with self.assertRaises(harrier.InvalidArgumentError):
            harrier.Client(servers=[])
        with self.assertRaises(harrier.InvalidArgumentError):
            self.client(rank=-2)
        with self.assertRaises(harrier.InvalidArgumentError):
            self.client(rpc_timeout=0)
        with self.assertRaisesRegex(harrier.InvalidArgumentError, "codec|bogus"):
            self.client(codec="bogus")
        with self.assertRaises(harrier.InvalidArgumentError):
            self.client(transport="carrier-pigeon")

    def test_unavailable(self):
        with self.assertRaises(harrier.UnavailableError) as caught:
            harrier.Client(servers=["127.0.0.1:1"], connect_timeout=0.5)
        self.assertIsInstance(caught.exception, ConnectionError)
        self.assertEqual(caught.exception.code_value, 14)
        self.assertIn("UNAVAILABLE", str(caught.exception))

    def test_scheduler(self):
        with self.client() as c:
            a = np.arange(1000, dtype=np.float32)
            b = initial()
            s = harrier.Scheduler(c, [("sched.a", a), ("sched.b", b)], techniques="all",
                                  partition_bytes=1 << 20, wait_timeout=20)
            expected_a, expected_b = a.copy(), b.copy()
            for step in range(2):
                s.wait_parameters(0)
                s.wait_parameters(1)
                np.testing.assert_array_equal(a, expected_a)
                np.testing.assert_array_equal(b, expected_b)
                ga = np.full(1000, 2.0 ** -step, np.float32)
                gb = gradient(step)
                s.gradient_ready(1, gb)
                s.gradient_ready(0, ga)
                s.end_backward()
                expected_a -= np.float32(LR) * ga
                expected_b -= np.float32(LR) * gb
            s.drain()
            np.testing.assert_array_equal(a, expected_a)
            np.testing.assert_array_equal(b, expected_b)
            s.refresh()
            np.testing.assert_array_equal(b, expected_b)
            stats = s.stats()
            self.assertGreaterEqual(stats["push_calls"], 4)
            self.assertEqual(stats["bytes_pushed"], 2 * (1000 + N) * 4)
            # The scheduler's buffers are staging buffers: over tcp (the
            # default here) every pulled byte landed in place.
            client_stats = c.stats()
            self.assertGreater(client_stats["bytes_pulled"], 0)
            self.assertEqual(client_stats["bytes_landed_in_staging"], client_stats["bytes_pulled"])
            with self.assertRaises(harrier.OutOfRangeError) as caught:
                s.wait_parameters(2)
            self.assertIsInstance(caught.exception, IndexError)
            with self.assertRaises(harrier.InvalidArgumentError):
                s.gradient_ready(0, np.ones(999, np.float32))
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "unknown|technique"):
                harrier.Scheduler(c, [("sched.c", np.zeros(4, np.float32))], techniques="teleport")
            with self.assertRaises(harrier.InvalidArgumentError):
                harrier.Scheduler(c, [("sched.d", np.zeros(4, np.float64))])
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "forward_order_tail"):
                harrier.Scheduler(c, [("sched.e", np.zeros(4, np.float32))],
                                  forward_order_tail=1.5)
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "'measure'"):
                harrier.Scheduler(c, [("sched.f", np.zeros(4, np.float32))],
                                  forward_order_tail="auto")
            # One worker: priority reorders freely, nothing is planned or measured.
            self.assertEqual(stats["forward_order_tail"], 0.0)
            self.assertEqual(stats["measured_forward_order_tail"], -1.0)
            s.close()
            with self.assertRaises(harrier.FailedPreconditionError):
                s.drain()

    def test_timeline(self):
        # The client's own calls and waits, and a scheduler's calls (each
        # once, with its step), until stop_timeline; nothing after it.
        path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "binding_timeline.json")
        with self.client() as c:
            c.register("tl", initial())
            c.start_timeline(path)
            with self.assertRaisesRegex(harrier.FailedPreconditionError, "already"):
                c.start_timeline(path + ".2")
            c.push_pull_async("tl", gradient(0)).wait(20)
            c.pull("tl")
            a = np.arange(1000, dtype=np.float32)
            s = harrier.Scheduler(c, [("tl.a", a)], techniques="all", wait_timeout=20)
            for step in range(2):
                s.wait_parameters(0)
                s.gradient_ready(0, np.full(1000, 1.0, np.float32))
                s.end_backward()
            s.drain()
            stats = s.stats()
            s.close()
            c.stop_timeline()
            c.stop_timeline()  # a no-op once stopped
            c.pull_async("tl", clock=0).wait(20)  # not recorded
        with open(path) as f:
            events = json.load(f)
        spans = [e for e in events if e.get("ph") == "X"]
        names = collections.Counter((e["cat"], e["name"]) for e in spans)
        self.assertEqual(names[("push-pull", "push-pull of 'tl'")], 1)
        self.assertEqual(names[("pull", "pull of 'tl'")], 1)
        # The scheduler's calls carry their step, and the client does not
        # record them a second time.
        scheduled = [e for e in spans if e["cat"] in ("push", "pull") and "step" in e["args"]]
        self.assertEqual(sum(e["cat"] == "push" for e in scheduled), stats["push_calls"])
        self.assertEqual(sum(e["cat"] == "pull" for e in scheduled), stats["pull_calls"])
        by_client = {e["name"] for e in spans if "operation" in e["args"] and e["cat"] != "wait"}
        self.assertEqual(by_client, {"push-pull of 'tl'", "pull of 'tl'"})
        self.assertEqual(sorted(e["name"] for e in spans if e["cat"] == "step"),
                         ["step 0", "step 1"])
        with self.assertRaisesRegex(harrier.InvalidArgumentError, "nonexistent"):
            with self.client() as c:
                c.start_timeline("/nonexistent-dir/t.json")


    def test_two_clients_under_one_timeline_path(self):
        # Rank 0 of two jobs in one process, both under HARRIER_TIMELINE:
        # the second must not truncate the first's file, and says it
        # records none.
        path = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "shared_timeline.json")
        old = os.environ.get("HARRIER_TIMELINE")
        os.environ["HARRIER_TIMELINE"] = path
        stderr = io.StringIO()
        try:
            with Cluster(shards=1, workers=1) as other, self.client() as first, \
                    contextlib.redirect_stderr(stderr):
                first.register("tl2", initial())
                first.pull("tl2")
                with harrier.Client(servers=other.servers, rpc_timeout=20.0,
                                    connect_timeout=10.0) as second:
                    self.assertIn(f"{path} is recorded by another Client", stderr.getvalue())
                    second.register("tl2", initial())
                    second.pull("tl2")
                    # An explicit start on that file is refused.
                    with self.assertRaisesRegex(harrier.FailedPreconditionError, "another"):
                        second.start_timeline(path)
                first.pull("tl2")
        finally:
            if old is None:
                del os.environ["HARRIER_TIMELINE"]
            else:
                os.environ["HARRIER_TIMELINE"] = old
        with open(path) as f:
            events = json.load(f)
        pulls = [e for e in events if e.get("ph") == "X" and e["name"] == "pull of 'tl2'"]
        self.assertEqual(len(pulls), 2)  # the first client's two, the second's none

class UcxTest(unittest.TestCase):
    """The same exact values over UCX (tcp here; shards with --ucx)."""

    def test_push_pull_over_ucx(self):
        with Cluster(shards=2, workers=1, server_args=["--optimizer=sgd", f"--lr={LR}", "--ucx"]) \
                as cluster, harrier.Client(servers=cluster.servers, transport="ucx",
                                           chunk_bytes=1 << 20, rpc_timeout=20) as c:
            w0 = initial()
            c.register("ucx", w0)
            out = np.empty(N, np.float32)
            c.push_pull_async("ucx", gradient(1), out).wait(20)
            np.testing.assert_array_equal(out, w0 - np.float32(LR) * gradient(1))
            self.assertEqual(c.data_paths, ["ucx", "ucx"])


class BlockingTest(unittest.TestCase):
    """Two workers configured, one present: its pull of clock 1 waits (BSP)."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(shards=1, workers=2, server_args=["--optimizer=sgd", f"--lr={LR}"])

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_deadline_and_gil_released(self):
        with harrier.Client(servers=self.cluster.servers, rank=0, rpc_timeout=1.5) as c:
            c.register("blocked", np.ones(1000, np.float32))
            c.push("blocked", np.ones(1000, np.float32))
            c.clock()
            out = np.full(1000, 7.0, np.float32)
            # A wait with a deadline: cancelled, the buffer untouched.
            with self.assertRaises(harrier.DeadlineExceededError) as caught:
                c.pull_async("blocked", out).wait(timeout=0.3)
            self.assertIsInstance(caught.exception, TimeoutError)
            np.testing.assert_array_equal(out, np.full(1000, 7.0, np.float32))
            # A blocking pull releases the GIL: another thread runs while it
            # waits (ticks counted only well inside the pull's 1.5 s).
            window = [float("inf"), float("inf")]
            inside = [0]
            stop = threading.Event()

            def count():
                while not stop.is_set():
                    if window[0] < time.monotonic() < window[1]:
                        inside[0] += 1
            counter = threading.Thread(target=count)
            counter.start()
            started = time.monotonic()
            window[:] = [started + 0.3, started + 1.2]
            try:
                with self.assertRaises(harrier.DeadlineExceededError):
                    c.pull("blocked", out)  # bounded by rpc_timeout
            finally:
                stop.set()
                counter.join(5)
            self.assertGreater(time.monotonic() - started, 1.2)
            self.assertGreater(inside[0], 1000)


class OwnClockTest(unittest.TestCase):
    """A tensor registered after 100 training clocks, on a clock of its own,
    under BSP, SSP and ASP: two workers (one client each, one thread each)
    push it three times; each pull after both pushed sees every push."""

    def run_mode(self, sync, server_args=()):
        with Cluster(shards=2, workers=2, sync=sync,
                     server_args=["--optimizer=sgd", "--lr=1", *server_args]) as cluster:
            clients = [harrier.Client(servers=cluster.servers, rank=r, rpc_timeout=20.0)
                       for r in range(2)]
            seen = [[], []]
            errors = []

            def worker(rank):
                try:
                    c = clients[rank]
                    c.register("w", (4,))
                    for _ in range(100):
                        c.push("w", np.ones(4, dtype=np.float32))
                        c.clock()
                    c.register("late", np.full(8, 10.0, dtype=np.float32), own_clock=True)
                    for k in range(3):
                        self.assertEqual(c.tensor_clock("late"), k)
                        c.push("late", np.full(8, float(rank + 1), dtype=np.float32))
                        c.barrier(f"pushed{k}")  # both pushes of round k are in
                        seen[rank].append(c.pull("late")[0])
                        c.barrier(f"pulled{k}")
                    self.assertEqual(c.current_clock, 100)  # the training clock did not move
                    self.assertEqual(c.tensor_clock("w"), 100)
                except Exception as e:  # reported by the main thread
                    errors.append(e)

            threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
            for c in clients:
                c.close()
            self.assertFalse(errors, errors)
            # lr 1, pushes averaged over 2 workers: 10 - (1 + 2) / 2 per round.
            for rank in range(2):
                self.assertEqual(seen[rank], [8.5, 7.0, 5.5], f"{sync} rank {rank}")

    def test_bsp(self):
        self.run_mode("bsp")

    def test_ssp(self):
        self.run_mode("ssp", ["--staleness=2"])

    def test_asp(self):
        self.run_mode("asp")

    def test_a_tensor_with_codecs_of_its_own(self):
        n = 1 << 16
        with Cluster(shards=1, workers=1, server_args=["--optimizer=sgd", "--lr=1"]) as cluster:
            with harrier.Client(servers=cluster.servers) as c:  # the client's codec: none
                c.register("dense", np.zeros(n, dtype=np.float32))
                c.register("half", np.zeros(n, dtype=np.float32), codec="fp16")
                with self.assertRaisesRegex(harrier.InvalidArgumentError, "tensor 'bad'"):
                    c.register("bad", (n,), codec="nope")
                g = np.full(n, 1.0 / 3.0, dtype=np.float32)
                before = c.stats()["bytes_pushed"]
                c.push("dense", g)
                dense_bytes = c.stats()["bytes_pushed"] - before
                c.push("half", g)
                half_bytes = c.stats()["bytes_pushed"] - before - dense_bytes
                c.clock()
                self.assertEqual(dense_bytes, 4 * n)
                self.assertLess(half_bytes, 0.6 * dense_bytes)  # 2 bytes an element and a header
                np.testing.assert_array_equal(c.pull("dense"), -g)
                half = c.pull("half")
                self.assertFalse(np.array_equal(half, -g))  # rounded to fp16 on the way
                np.testing.assert_allclose(half, -g, rtol=1e-3)

    def test_a_tensor_is_registered_with_one_clock(self):
        with Cluster(shards=1, workers=1) as cluster:
            with harrier.Client(servers=cluster.servers) as c:
                c.register("x", (4,), own_clock=True)
                with self.assertRaisesRegex(harrier.InvalidArgumentError,
                                            "keeps a clock of its own"):
                    c.register("x", (4,))
                with self.assertRaisesRegex(harrier.InvalidArgumentError, "kind must be"):
                    c.register("y", (4,), kind="sum")

if __name__ == "__main__":
    main()
