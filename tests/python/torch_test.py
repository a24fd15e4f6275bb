"""harrier.torch.DistributedOptimizer with worker processes against real
shards: N BSP steps of plain SGD through Harrier equal single-process
PyTorch on the concatenated batch (with and without the comm scheduler,
updated on the shards or on the workers); the loss falls under BSP, SSP,
ASP and local SGD; broadcast_parameters; configuration errors."""

import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
import torch.nn.functional as F

import harrier
import harrier.torch as htorch
from harrier_testing import ROOT, Cluster, main

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_worker.py")
sys.path.insert(0, os.path.dirname(WORKER))
import torch_worker  # noqa: E402


def run_workers(cluster, workers=2, timeout=180, **flags):
    directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    processes, outs = [], []
    for rank in range(workers):
        out = os.path.join(directory, f"worker{rank}.npz")
        args = [sys.executable, WORKER, "--servers=" + ",".join(cluster.servers),
                f"--rank={rank}", f"--workers={workers}", f"--out={out}"]
        args += [f"--{k}={v}" if v is not True else f"--{k}" for k, v in flags.items()]
        processes.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
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
        results.append(dict(np.load(outs[rank])))
    return results


def single_process(steps, batch, lr):
    model, inputs, labels = torch_worker.model_and_data(0, steps, batch)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(inputs[step]), labels[step]).backward()
        optimizer.step()
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


class EquivalenceTest(unittest.TestCase):
    """Two workers with 16 examples each = one process with 32."""

    STEPS, BATCH, LR = 6, 16, 0.1

    def check(self, sync="bsp", server_args=("--optimizer=sgd", "--lr=0.1"), **flags):
        expected = single_process(self.STEPS, 2 * self.BATCH, self.LR)
        with Cluster(shards=2, workers=2, sync=sync, server_args=list(server_args)) as cluster:
            results = run_workers(cluster, steps=self.STEPS, batch=self.BATCH, lr=self.LR, **flags)
        initial = single_process(0, 2 * self.BATCH, self.LR)
        for result in results:
            np.testing.assert_allclose(result["params"], expected, rtol=1e-5, atol=1e-6)
            # Not vacuous: training moved the parameters.
            self.assertGreater(np.abs(result["params"] - initial).max(), 1e-3)
        return results

    def test_server_update(self):
        results = self.check()
        # Pushed from p.grad and pulled into p: no arrays of its own.
        self.assertEqual([int(r["staged"]) for r in results], [0, 0])

    def test_server_update_through_scheduler(self):
        self.check(techniques="all")

    def test_server_update_through_scheduler_front_last(self):
        # Both workers push the back half of the bytes in the order of
        # backward, then the front half front first: the same result.
        self.check(techniques="all", forward_order_tail=0.5)

    def test_server_update_through_scheduler_measured_tail(self):
        # Each worker times its second step; both plan the average of the
        # two estimates, which the shards computed, from the third.
        results = self.check(techniques="all", forward_order_tail="measure")
        estimates = [float(r["tail_estimate"]) for r in results]
        for estimate in estimates:
            self.assertGreaterEqual(estimate, 0.0)
            self.assertLessEqual(estimate, 1.0)
        self.assertEqual([float(r["tail"]) for r in results], [float(results[0]["tail"])] * 2)
        self.assertAlmostEqual(float(results[0]["tail"]), sum(estimates) / 2, places=6)
        self.assertEqual([int(r["tail_from_step"]) for r in results], [2, 2])

    def test_worker_update(self):
        # Each worker steps locally and pushes old - new; shards at lr 1 take
        # the average: the same as averaging the gradients.
        results = self.check(update="worker", server_args=("--optimizer=sgd", "--lr=1"))
        # The model's four parameters travel as one tensor: a push a step.
        self.assertEqual([int(r["pushes"]) for r in results], [self.STEPS] * 2)

    def test_worker_update_one_tensor_a_parameter(self):
        results = self.check(update="worker", server_args=("--optimizer=sgd", "--lr=1"),
                             fusion_bytes=-1)
        self.assertEqual([int(r["pushes"]) for r in results], [4 * self.STEPS] * 2)

    def test_local_sgd_one_step_rounds(self):
        self.check(sync="local", server_args=("--local_steps=1",))


class ConvergenceTest(unittest.TestCase):
    """The loss falls under every sync mode."""

    def check(self, sync, server_args=(), **flags):
        with Cluster(shards=1, workers=2, sync=sync,
                     server_args=["--optimizer=sgd", "--lr=0.1", *server_args]) as cluster:
            results = run_workers(cluster, steps=60, batch=16, lr=0.1, **flags)
        for result in results:
            losses = result["losses"]
            self.assertLess(losses[-10:].mean(), 0.5 * losses[:10].mean(), f"{sync}: {losses}")
        return results

    def test_bsp(self):
        self.check("bsp")

    def test_ssp(self):
        self.check("ssp", ["--staleness=2"])

    def test_asp_with_scheduler(self):
        self.check("asp", techniques="wfbp+fusion")

    def test_local_sgd(self):
        self.check("local", ["--local_steps=4"])

    def test_compressed_pushes(self):
        dense = self.check("bsp")
        compressed = self.check("bsp", codec="efsign")
        self.assertLess(compressed[0]["bytes_pushed"] * 8, dense[0]["bytes_pushed"])


class ReadmeExampleTest(unittest.TestCase):
    def test_readme_from_pytorch_example_runs(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            readme = f.read()
        section = readme[readme.index("## From PyTorch"):]
        code = section[section.index("```python\n") + 10:]
        code = code[:code.index("```")]
        self.assertIn("import harrier.torch as hvd", code)
        self.assertLessEqual(len(code.strip().splitlines()), 13)
        # As harrier-launch -np 2 runs it: two processes told the job by
        # their environment.
        with Cluster(shards=2, workers=2) as cluster:
            runs = []
            for rank in range(2):
                env = dict(os.environ, HARRIER_SERVERS=",".join(cluster.servers),
                           HARRIER_RANK=str(rank), HARRIER_NUM_WORKERS="2")
                runs.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE))
            outputs = [run.communicate(timeout=120) for run in runs]
        losses = []
        for rank, (run, (out, err)) in enumerate(zip(runs, outputs)):
            self.assertEqual(run.returncode, 0, err.decode()[-2000:])
            printed = out.decode().split()
            self.assertEqual(printed[0], str(rank))
            losses.append(float(printed[1]))
        self.assertEqual(losses[0], losses[1])  # the allreduced loss, the same on both


class BroadcastAndErrorsTest(unittest.TestCase):
    def test_broadcast_parameters(self):
        with Cluster(shards=1, workers=2, server_args=["--optimizer=sgd", "--lr=0.1"]) as cluster:
            results = run_workers(cluster, steps=2, broadcast=True)
        for result in results:  # root rank 1: table of 2.0, counter 8
            np.testing.assert_array_equal(result["broadcast"], [2.0] * 15 + [8.0])

    def test_configuration_errors(self):
        with Cluster(shards=1, workers=1, sync="ssp", server_args=["--staleness=1"]) as cluster, \
                harrier.Client(servers=cluster.servers) as client:
            model = torch.nn.Linear(4, 2)
            sgd = torch.optim.SGD(model.parameters(), lr=0.1)
            with self.assertRaisesRegex(ValueError, "'bsp'.*'ssp'"):
                htorch.DistributedOptimizer(sgd, model.named_parameters(), client=client, sync="bsp")
            with self.assertRaisesRegex(ValueError, "belong to the Client"):
                htorch.DistributedOptimizer(sgd, model.named_parameters(), client=client, codec="topk")
            with self.assertRaisesRegex(ValueError, "update must be"):
                htorch.DistributedOptimizer(sgd, model.named_parameters(), client=client, update="gpu")
            with self.assertRaisesRegex(ValueError, "float32"):
                double = torch.nn.Linear(4, 2).double()
                htorch.DistributedOptimizer(sgd, double.named_parameters(), client=client)
            with self.assertRaisesRegex(ValueError, "no parameters"):
                htorch.DistributedOptimizer(sgd, [], client=client)
            with self.assertRaisesRegex(ValueError, "root_rank"):
                htorch.broadcast_parameters(model.state_dict(), root_rank=3, client=client)
            # A usable one: under SSP, and the step changes the model.
            opt = htorch.DistributedOptimizer(sgd, model.named_parameters(), client=client,
                                              sync="ssp")
            before = model.weight.detach().clone()
            F.mse_loss(model(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
            opt.step()
            self.assertFalse(torch.equal(before, model.weight.detach()))
            self.assertEqual(opt.stats()["steps"], 1)
            opt.finish()


if __name__ == "__main__":
    main()
