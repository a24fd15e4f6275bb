"""harrier.torch's Horovod surface with worker processes against real
shards, each joining through init() from the environment harrier-launch
sets: the user's momentum optimizer and schedule applied as written (N
steps equal single-process PyTorch on the concatenated batch), broadcasts
of parameters, optimizer state and objects; metrics averaged by names
registered after 100 training steps under BSP, SSP and ASP; a name one rank
never pushes fails in time with a clear error; configuration errors; the
Horovod-style example reaching the single-process accuracy with 2 and 4
workers."""

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.nn.functional as F

import harrier
import harrier.torch as hvd
from harrier_testing import ROOT, Cluster, main

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "horovod_worker.py")
EXAMPLE = os.path.join(ROOT, "examples", "horovod_style_fashion_mnist.py")
sys.path.insert(0, HERE)
import torch_worker  # noqa: E402


def environment(cluster, rank, workers, extra=None):
    env = dict(os.environ)
    env.update(extra or {})
    env.update(HARRIER_SERVERS=",".join(cluster.servers), HARRIER_RANK=str(rank),
               HARRIER_NUM_WORKERS=str(workers), HARRIER_LOCAL_RANK=str(rank),
               HARRIER_LOCAL_SIZE=str(workers))
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
    return env


def run_workers(cluster, scenario, workers=2, timeout=180, env=None, **flags):
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    processes, outs = [], []
    for rank in range(workers):
        out = os.path.join(directory, f"worker{rank}.npz")
        args = [sys.executable, WORKER, f"--scenario={scenario}", f"--out={out}"]
        args += [f"--{k}={v}" for k, v in flags.items()]
        processes.append(subprocess.Popen(args, env=environment(cluster, rank, workers, env),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
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


class HorovodScriptTest(unittest.TestCase):
    def check_momentum(self, env=None, **flags):
        steps, batch, lr = 6, 32, 0.1
        with Cluster(shards=2, workers=2) as cluster:
            results = run_workers(cluster, "momentum", env=env, steps=steps, batch=batch, lr=lr,
                                  **flags)
        # One process: rank 0's initial model, the whole batch, the same
        # optimizer and schedule.
        _, inputs, labels = torch_worker.model_and_data(0, steps, batch)
        torch.manual_seed(100)
        model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        for step in range(steps):
            optimizer.zero_grad()
            F.cross_entropy(model(inputs[step]), labels[step]).backward()
            optimizer.step()
            schedule.step()
        expected = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
        start = np.concatenate([p.detach().numpy().ravel() for p in
                                torch_worker_initial(100)])
        for rank, result in enumerate(results):
            self.assertEqual(str(result["update"]), "average")
            self.assertAlmostEqual(float(result["lr"]), lr * 0.5 ** (steps // 2), places=7)
            np.testing.assert_allclose(result["params"], expected, rtol=0, atol=2e-6,
                                       err_msg=f"rank {rank}")
            # It trained: far from where it started.
            self.assertGreater(np.abs(result["params"] - start).max(), 1e-2)
            # The averaged gradients were handed back in the buckets, not
            # copied out of them.
            self.assertTrue(bool(result["grads_in_buckets"]), f"rank {rank}")

    def test_user_momentum_optimizer_and_schedule_as_written(self):
        self.check_momentum()

    def test_timeline_from_the_environment(self):
        # HARRIER_TIMELINE (what harrier-launch --timeline-filename sets) as
        # Horovod's HOROVOD_TIMELINE: each rank's file holds its push-pulls
        # of the gradient buckets, 6 steps of each, on lanes, and the waits.
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        self.check_momentum(env={"HARRIER_TIMELINE": os.path.join(directory, "t_{rank}.json")})
        for rank in range(2):
            with open(os.path.join(directory, f"t_{rank}.json")) as f:
                events = json.load(f)
            spans = [e for e in events if e.get("ph") == "X"]
            calls = collections.Counter(e["name"] for e in spans if e["cat"] == "push-pull")
            self.assertTrue(calls, f"rank {rank}: no push-pulls in {sorted(set(e['name'] for e in spans))}")
            # Every bucket pushed and pulled once a step.
            self.assertEqual(set(calls.values()), {6}, f"rank {rank}: {calls}")
            self.assertTrue(all(n.startswith("push-pull of 'harrier.gradient/") for n in calls), calls)
            ids = [e["args"]["operation"] for e in spans if e["cat"] != "wait"]
            self.assertEqual(len(ids), len(set(ids)))
            # Each wait names an operation of the file.
            waited = {e["args"]["operation"] for e in spans if e["cat"] == "wait"}
            self.assertTrue(waited <= set(ids), waited - set(ids))
            names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
            self.assertIn("waits", names.values())
            self.assertEqual({names[e["tid"]] for e in spans if e["cat"] == "wait"}, {"waits"})
            self.assertTrue(all(re.fullmatch(r"push-pull \d+", names[e["tid"]])
                                for e in spans if e["cat"] == "push-pull"))
            pid = {e["pid"] for e in events}
            self.assertEqual(pid, {rank})
        # Without {rank} only rank 0 writes, as Horovod's timeline.
        self.assertEqual(hvd._timeline_path("/t/t.json", 0), "/t/t.json")
        self.assertEqual(hvd._timeline_path("/t/t.json", 1), "")
        self.assertEqual(hvd._timeline_path("/t/t_{rank}.json", 1), "/t/t_1.json")

    def test_gradients_accumulated_in_the_buckets_or_allocated_afresh(self):
        # Two backward passes a step accumulate into the buckets' views; on
        # every other step zero_grad(set_to_none=True) makes autograd
        # allocate the gradients anew, and they are copied in.
        self.check_momentum(passes=2, zero_grad="alternate")

    def check_metrics(self, sync, server_args=()):
        lr = 0.05
        with Cluster(shards=2, workers=2, sync=sync,
                     server_args=["--optimizer=sgd", f"--lr={lr}", *server_args]) as cluster:
            results = run_workers(cluster, "metric", steps=101, batch=16, lr=lr)
        for rank, r in enumerate(results):
            for epoch in range(3):
                np.testing.assert_allclose(r[f"metric{epoch}"], [1.5 + epoch, 15.0],
                                           err_msg=f"rank {rank} epoch {epoch}")
            np.testing.assert_allclose(r["sum"], [3.0])
            np.testing.assert_array_equal(r["unnamed"], [2, 5])  # (0 + 3) / 2 rounded, 5
            self.assertEqual(str(r["int_dtype"]), "torch.int64")
            np.testing.assert_allclose(r["inplace"], [0.5] * 4)
            np.testing.assert_allclose(r["async"], [1.0])
            np.testing.assert_allclose(r["push_pull"], [2.0])
            for pull in ("paired", "none"):
                np.testing.assert_array_equal(r[f"big_{pull}"], [1.5] * 16384)  # exact in fp16
            # Dense: three 64 KiB replies. Paired: a dense first reply, then
            # two fp16 ones of half the bytes.
            self.assertGreaterEqual(int(r["pulled_none"]), 3 * 65536)
            self.assertLessEqual(int(r["pulled_paired"]), 0.7 * int(r["pulled_none"]))
            self.assertEqual(str(r["object"]),
                             '{"epoch": 7, "rank": 1, "text": "' + "\\u00e9" * 301 + '"}')
            np.testing.assert_allclose(r["broadcast"], np.arange(5.0) + 10)
            self.assertEqual(int(r["size"]), 2)
            self.assertEqual(list(r["local"]), [rank, 2])

    def test_metrics_registered_after_training_bsp(self):
        self.check_metrics("bsp")

    def test_metrics_registered_after_training_ssp(self):
        self.check_metrics("ssp", ["--staleness=3"])

    def test_metrics_registered_after_training_asp(self):
        self.check_metrics("asp")

    def test_compression_of_the_averaged_gradients(self):
        steps = 40
        # none and fp16: the 4 parameters' gradients fused into one bucket,
        # one push-pull a step. top-k and PowerSGD: one a parameter, and
        # the chunks under 16 KiB (the biases, the last layer) travel dense.
        # Pulls come back with the codec's pair (at most `most_pulled` of
        # dense, with the broadcast's dense pull and each view's dense
        # first reply), or dense with pull_compression=none.
        for codec, pull, most, most_pulled, calls in (
                ("none", "paired", 1.0, 1.06, 1), ("fp16", "paired", 0.52, 0.56, 1),
                ("fp16", "none", 0.52, 1.06, 1), ("topk", "paired", 0.3, 0.35, 4),
                ("powersgd", "paired", 0.3, 0.35, 4)):
            with Cluster(shards=2, workers=2) as cluster:  # a job ends with its workers
                results = run_workers(cluster, "compressed", steps=steps, batch=32, lr=0.05,
                                      codec=codec, pull_compression=pull)
                for rank, r in enumerate(results):
                    losses = r["losses"]
                    self.assertTrue(np.all(np.isfinite(losses)), f"{codec} rank {rank}")
                    self.assertLess(losses[-5:].mean(), 0.8 * losses[:5].mean(),
                                    f"{codec} rank {rank}: {losses}")
                    dense = 4 * int(r["elements"]) * steps
                    ratio = int(r["bytes_pushed"]) / dense
                    pulled = int(r["bytes_pulled"]) / dense
                    print(f"compression {codec}, pulls {pull}: pushed {ratio:.3f} of dense, "
                          f"pulled {pulled:.3f}")
                    self.assertLessEqual(ratio, most + 0.01, codec)
                    self.assertLessEqual(pulled, most_pulled, f"{codec} pulls {pull}")
                    if pull == "none":
                        self.assertGreaterEqual(pulled, 1.0, f"{codec} pulls {pull}")
                    # The broadcast's calls are pulls; every push is a bucket's.
                    self.assertEqual(int(r["pushes"]), calls * steps, codec)

    def test_join_with_uneven_data_and_clipping(self):
        with Cluster(shards=1, workers=2) as cluster:
            results = run_workers(cluster, "join")
        # Steps 1-3 average (1 + 2) / 2 = 1.5 per element; rank 1's steps 4
        # and 5 average its own 2 alone.
        np.testing.assert_array_equal(results[0]["weight"], [[-4.5, -4.5]])
        np.testing.assert_array_equal(results[1]["weight"], [[-8.5, -8.5]])
        # The clipped norm is the averaged gradient's: sqrt(2) * 1.5, then sqrt(2) * 2.
        np.testing.assert_allclose(results[1]["norms"], [1.5 * 2 ** 0.5] * 3 + [2 * 2 ** 0.5] * 2,
                                   rtol=1e-6)
        self.assertEqual([int(r["joined"]) for r in results], [0, 1])

    def test_a_name_one_rank_never_pushes_fails_in_time(self):
        with Cluster(shards=1, workers=2) as cluster:
            results = run_workers(cluster, "never", rpc_timeout=3)
        message = str(results[0]["message"])
        self.assertIn("harrier.allreduce/lonely: not every worker pushed it in time", message)
        self.assertIn("slowest worker is rank 1", message)
        self.assertLess(float(results[0]["seconds"]), 30)


def torch_worker_initial(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    return list(model.parameters())


class ConfigurationTest(unittest.TestCase):
    def tearDown(self):
        hvd.shutdown()

    def test_errors(self):
        with Cluster(shards=1, workers=1,
                     server_args=["--optimizer=momentum", "--lr=0.05", "--momentum=0.9"]) as c:
            hvd.init(servers=c.servers)
            self.assertEqual((hvd.size(), hvd.rank(), hvd.local_rank(), hvd.local_size()),
                             (1, 0, 0, 1))
            model = torch.nn.Linear(4, 2)

            def refused(pattern, **kwargs):
                optimizer = kwargs.pop("optimizer", torch.optim.SGD(model.parameters(), lr=0.1))
                with self.assertRaises(harrier.InvalidArgumentError) as caught:
                    hvd.DistributedOptimizer(optimizer, model.named_parameters(), **kwargs)
                self.assertRegex(str(caught.exception), pattern)

            # The shards' optimizer asked for, but the user's says otherwise.
            refused(r"--optimizer=momentum --lr=0.05 --momentum=0.9\) instead of SGD, but it "
                    r"is sgd, its lr is 0.1", update="server")
            refused(r"its momentum is 0.5", update="server",
                    optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5))
            refused(r"it is adam", update="server",
                    optimizer=torch.optim.Adam(model.parameters(), lr=0.05))
            refused(r"start them with --optimizer=sgd --lr=1 \(they run --optimizer=momentum",
                    update="worker")
            refused(r"votes on signs", compression=hvd.Compression.spec("signum"))
            refused(r"Adasum is not supported", op=hvd.Adasum)
            refused(r"compresses the averaged gradients", update="server",
                    compression=hvd.Compression.fp16,
                    optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
            # Matching settings are taken.
            ok = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                model.named_parameters(), update="server")
            self.assertEqual(ok.update, "server")
            # A backward more than backward_passes_per_step before step().
            passes = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              model.named_parameters(), prefix="passes/")
            model(torch.ones(1, 4)).sum().backward()
            with self.assertRaisesRegex(harrier.InvalidArgumentError,
                                        "computed 2 times before step\\(\\), more than "
                                        "backward_passes_per_step=1"):
                model(torch.ones(1, 4)).sum().backward()
            passes.close()
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "op must be"):
                hvd.allreduce(torch.ones(2), op="max")
            # A device the binding cannot read: one line saying so.
            with self.assertRaisesRegex(harrier.InvalidArgumentError,
                                        "a tensor on meta; this harrier.torch trains CPU"):
                hvd.allreduce(torch.empty(3, device="meta"))
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "first used with 2"):
                hvd.allreduce(torch.ones(2), name="shape")
                hvd.allreduce(torch.ones(3), name="shape")
            hvd.shutdown()  # while the shard is there to be left

    def test_single_process_without_shards(self):
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("HARRIER_")}
        try:
            os.environ["HARRIER_NUM_WORKERS"] = "2"
            with self.assertRaisesRegex(harrier.InvalidArgumentError, "no shards given for a job "
                                        "of 2 workers. Run the script under harrier-launch"):
                hvd.init()
            del os.environ["HARRIER_NUM_WORKERS"]
            hvd.init()  # python3 train.py, as Horovod runs it
            self.assertEqual((hvd.size(), hvd.rank()), (1, 0))
            np.testing.assert_allclose(hvd.allreduce(torch.tensor([3.0, 4.0])).numpy(), [3, 4])
            self.assertEqual(hvd.broadcast_object({"a": 1}), {"a": 1})
            model = torch.nn.Linear(3, 1)
            optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                                 model.named_parameters())
            before = model.weight.detach().clone()
            model(torch.ones(1, 3)).sum().backward()
            optimizer.step()
            np.testing.assert_allclose(model.weight.detach().numpy(), before.numpy() - 0.5)
        finally:
            os.environ.pop("HARRIER_NUM_WORKERS", None)
            os.environ.update(saved)


class SecurityTest(unittest.TestCase):
    """init() takes TLS files and the job token from the environment, as
    harrier-launch and the Kubernetes manifests set them."""

    def test_tls_and_token_from_the_environment(self):
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        script = """
set -e
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out ca.key
openssl req -x509 -new -key ca.key -out ca.pem -days 2 -subj /CN=py-test-ca \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out server.key
openssl req -new -key server.key -out server.csr -subj /CN=localhost
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
  -days 2 -extfile server.ext
"""
        made = subprocess.run(["sh", "-c", script], cwd=directory, capture_output=True, timeout=60)
        if made.returncode != 0:
            self.skipTest("openssl could not make certificates: " + made.stderr.decode()[-300:])
        token = os.path.join(directory, "token")
        with open(token, "w") as f:
            f.write("s3cret-token\n")
        os.chmod(token, 0o600)
        path = lambda name: os.path.join(directory, name)  # noqa: E731
        with Cluster(shards=1, workers=1,
                     server_args=[f"--tls_cert={path('server.pem')}",
                                  f"--tls_key={path('server.key')}",
                                  f"--auth_token_file={token}"]) as cluster:
            code = ("import torch, harrier.torch as hvd; hvd.init(connect_timeout=5, "
                    "rpc_timeout=10); print('avg=%g' % hvd.allreduce(torch.tensor(3.0)).item())")

            def run(**extra):
                env = dict(environment(cluster, 0, 1), **extra)
                return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                      timeout=120)

            ok = run(HARRIER_TLS_CA=path("ca.pem"), HARRIER_AUTH_TOKEN_FILE=token)
            self.assertEqual(ok.returncode, 0, ok.stderr.decode()[-2000:])
            self.assertIn("avg=3", ok.stdout.decode())
            no_token = run(HARRIER_TLS_CA=path("ca.pem"))
            self.assertNotEqual(no_token.returncode, 0)
            self.assertRegex(no_token.stderr.decode(), "UNAUTHENTICATED|PERMISSION_DENIED|UNAVAILABLE")
            no_tls = run(HARRIER_AUTH_TOKEN_FILE=token)
            self.assertNotEqual(no_tls.returncode, 0)


class ExampleTest(unittest.TestCase):
    """The Horovod-style example, unchanged, under harrier-launch with 2 and
    4 workers and as one plain process: the same accuracy within a point."""

    def run_example(self, workers):
        flags = ["--epochs=4", "--momentum=0.9"]
        if workers == 0:
            run = subprocess.run([sys.executable, EXAMPLE, *flags], capture_output=True,
                                 timeout=300, env=plain_environment())
        else:
            launch = os.path.join(ROOT, "deploy", "launch", "harrier-launch")
            run = subprocess.run([launch, f"-np={workers}", "--base_port=0",
                                  "--grace_ms=5000", "--", sys.executable, EXAMPLE, *flags],
                                 capture_output=True, timeout=600, env=plain_environment())
        output = run.stdout.decode() + run.stderr.decode()
        self.assertEqual(run.returncode, 0, output[-3000:])
        found = re.findall(r"test_accuracy=([0-9.]+)", run.stdout.decode())
        self.assertEqual(len(found), 1, output[-3000:])
        return float(found[0])

    def test_two_and_four_workers_reach_the_single_process_accuracy(self):
        if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
            self.skipTest("no dataset-fashion-mnist")
        single = self.run_example(0)
        self.assertGreater(single, 0.75)
        for workers in (2, 4):
            accuracy = self.run_example(workers)
            print(f"example: {workers} workers test_accuracy={accuracy:.4f}, "
                  f"one process {single:.4f}")
            self.assertGreater(accuracy, single - 0.01, f"{workers} workers")


def plain_environment():
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARRIER_")}
    return env


if __name__ == "__main__":
    main()
