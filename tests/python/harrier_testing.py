"""What the Python tests share: real harrier-server processes on 127.0.0.1
and a unittest runner that ends with the line "N checks passed, M failed"
that deploy/test.sh counts."""

import os
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", "harrier"))


def server_binary():
    path = os.environ.get("HARRIER_SERVER") or os.path.join(ROOT, "server", "harrier-server")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"harrier-server not found at {path} (set HARRIER_SERVER)")
    return path


class Cluster:
    """Shards of one job on 127.0.0.1 with ephemeral ports; stops them on
    close (every wait bounded)."""

    def __init__(self, shards=1, workers=1, sync="bsp", server_args=(), start_timeout=20.0):
        self.dir = tempfile.mkdtemp(prefix="harrier-py-", dir=os.environ.get("TEST_TMPDIR"))
        self.processes = []
        self.logs = []
        for shard in range(shards):
            port_file = os.path.join(self.dir, f"shard{shard}.port")
            log = open(os.path.join(self.dir, f"shard{shard}.log"), "w")
            args = [server_binary(), "--host=127.0.0.1", "--port=0", f"--port_file={port_file}",
                    f"--shard={shard}", f"--num_shards={shards}", f"--num_workers={workers}",
                    f"--sync={sync}", *server_args]
            self.processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
            self.logs.append(log)
        self.servers = []
        deadline = time.monotonic() + start_timeout
        for shard in range(shards):
            port_file = os.path.join(self.dir, f"shard{shard}.port")
            while not (os.path.exists(port_file) and open(port_file).read().strip()):
                if self.processes[shard].poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"shard {shard} did not start: {self.log_tail(shard)}")
                time.sleep(0.05)
            self.servers.append("127.0.0.1:" + open(port_file).read().strip())

    def log_tail(self, shard, lines=5):
        try:
            with open(os.path.join(self.dir, f"shard{shard}.log")) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self):
        for p in self.processes:
            if p.poll() is None:
                p.terminate()
        for p in self.processes:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for log in self.logs:
            log.close()
        self.processes = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def main():
    """Runs the calling module's tests; prints the summary line test.sh counts."""
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules["__main__"])
    result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed} checks passed, {failed} failed")
    sys.exit(0 if result.wasSuccessful() and result.testsRun > 0 else 1)
