"""A Python push and pull equal the C++ client's bit for bit: the same
initial values and gradients through the binding and through
worker/client.h (cpp_push_pull), each against fresh shards, with dense,
top-k (error feedback), QSGD (seeded randomness) and compressed pulls."""

import os
import subprocess
import tempfile
import unittest

import numpy as np

import harrier
from harrier_testing import ROOT, Cluster, main

N = 300_000       # 1.2 MB: three chunks of 512 KiB over two shards
STEPS = 4
CHUNK = 512 << 10
SERVER_ARGS = ["--optimizer=momentum", "--lr=0.1", "--momentum=0.9"]


def data():
    rng = np.random.default_rng(7)
    return rng.standard_normal((STEPS + 1, N)).astype(np.float32)


class ParityTest(unittest.TestCase):
    def run_python(self, codec, pull_codec, values):
        with Cluster(shards=2, workers=1, server_args=SERVER_ARGS) as cluster, \
                harrier.Client(servers=cluster.servers, codec=codec, pull_codec=pull_codec,
                               chunk_bytes=CHUNK, rpc_timeout=20) as client:
            client.register("parity", values[0])
            pulled = np.empty((STEPS, N), np.float32)
            for step in range(STEPS):
                client.push("parity", values[step + 1])
                client.clock()
                client.pull("parity", pulled[step])
            client.leave()
            return pulled

    def run_cpp(self, codec, pull_codec, values):
        directory = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        source, result = os.path.join(directory, "in.f32"), os.path.join(directory, "out.f32")
        values.tofile(source)
        with Cluster(shards=2, workers=1, server_args=SERVER_ARGS) as cluster:
            subprocess.run([os.path.join(ROOT, "tests", "python", "cpp_push_pull"),
                            "--servers=" + ",".join(cluster.servers), f"--codec={codec}",
                            f"--pull_codec={pull_codec}", f"--n={N}", f"--steps={STEPS}",
                            f"--chunk_bytes={CHUNK}", f"--input={source}", f"--output={result}"],
                           check=True, timeout=120)
        return np.fromfile(result, dtype=np.float32).reshape(STEPS, N)

    def check(self, codec, pull_codec="none"):
        values = data()
        python = self.run_python(codec, pull_codec, values)
        cpp = self.run_cpp(codec, pull_codec, values)
        self.assertEqual(python.tobytes(), cpp.tobytes(), f"codec={codec} pull_codec={pull_codec}")
        # And the run did something: the parameters moved every step.
        self.assertFalse(np.array_equal(python[0], values[0]))
        self.assertFalse(np.array_equal(python[-1], python[-2]))
        return python

    def test_dense(self):
        pulled = self.check("none")
        # Dense momentum SGD, computed here: the shards' arithmetic exactly.
        values = data()
        w, velocity = values[0].copy(), np.zeros(N, np.float32)
        for step in range(STEPS):
            velocity = np.float32(0.9) * velocity + values[step + 1]
            w = w - np.float32(0.1) * velocity
            np.testing.assert_allclose(pulled[step], w, rtol=1e-6, atol=1e-6)

    def test_topk_error_feedback(self):
        self.check("topk:ratio=0.01")

    def test_qsgd_seeded(self):
        self.check("qsgd:levels=16,bucket=512")

    def test_compressed_pulls(self):
        self.check("efsign", pull_codec="topk:ratio=0.05")


if __name__ == "__main__":
    main()
