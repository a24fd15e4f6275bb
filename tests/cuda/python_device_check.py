"""The Python binding's device path, on a machine with a GPU and a module
built with --config=cuda (run_gpu_checks.sh runs it):

    python_device_check.py HARRIER_SERVER_BINARY

Device memory comes from the module's _DeviceArrayForTesting (what
__cuda_array_interface__ shows, as CuPy and CUDA tensors do), so it runs
with Debian's CPU-only PyTorch too; where torch.cuda is available it also
averages a CUDA tensor through harrier.torch and trains one step of a CUDA
model against the same step on the CPU. Prints PASS/FAIL lines; exits 0
only when nothing failed."""

import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import harrier
from harrier import _harrier

failed = 0


def result(name, ok, detail=""):
    global failed
    print(f"{'PASS' if ok else 'FAIL'} python {name}{f' ({detail})' if detail else ''}", flush=True)
    failed += 0 if ok else 1


def start_shard(binary, directory):
    port_file = os.path.join(directory, "port")
    shard = subprocess.Popen([binary, "--host=127.0.0.1", "--port=0", f"--port_file={port_file}",
                              "--shard=0", "--num_shards=1", "--num_workers=1",
                              "--optimizer=sgd", "--lr=0.5"],
                             stdout=open(os.path.join(directory, "shard.log"), "w"),
                             stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if shard.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the shard did not start")
        time.sleep(0.05)
    return shard, "127.0.0.1:" + open(port_file).read().strip()


def main():
    result("module built with CUDA", _harrier.built_with_cuda)
    if not _harrier.built_with_cuda:
        return
    directory = tempfile.mkdtemp(prefix="harrier-pydev-")
    shard, server = start_shard(sys.argv[1], directory)
    try:
        n = 1 << 16
        values = np.linspace(-1, 1, n, dtype=np.float32)
        with harrier.Client(servers=[server], compress_min_bytes=1024) as client:
            gradient = _harrier._DeviceArrayForTesting(n)
            gradient.from_host(values)
            out = _harrier._DeviceArrayForTesting(n)
            # An average tensor in device memory: one worker's average is its push.
            client.register("avg", (n,), kind="average", memory="device")
            client.push_pull("avg", gradient, out)
            back = out.to_host(np.empty(n, dtype=np.float32))
            result("average of a device tensor", np.array_equal(back, values))
            # Parameters in device memory, pushes compressed on the device (fp16).
            client.register("w", np.zeros(n, dtype=np.float32), codec="fp16", memory="device")
            client.push("w", gradient)
            client.clock()
            client.pull("w", out)
            back = out.to_host(np.empty(n, dtype=np.float32))
            error = float(np.abs(back + 0.5 * values).max())
            result("fp16 push of a device tensor, stepped by the shard", error < 1e-3,
                   f"max error {error:.2e}")
            # A host buffer for a device tensor is refused, not misread.
            try:
                client.push("w", values)
                result("host array for a device tensor refused", False)
            except harrier.InvalidArgumentError as e:
                result("host array for a device tensor refused", "device memory" in str(e))
        try:
            import torch
        except ImportError:
            torch = None
        if torch is None or not torch.cuda.is_available():
            print("SKIP python CUDA tensors through harrier.torch: this PyTorch has no CUDA")
            return
        import harrier.torch as hvd
        hvd.init(servers=[server])
        x = torch.arange(8.0, device="cuda")
        result("allreduce of a CUDA tensor",
               torch.equal(hvd.allreduce(x, name="cuda").cpu(), x.cpu()))
        torch.manual_seed(0)
        cpu_model = torch.nn.Linear(16, 4)
        cuda_model = torch.nn.Linear(16, 4).cuda()
        cuda_model.load_state_dict(cpu_model.state_dict())
        inputs = torch.randn(8, 16)
        cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(cuda_model.parameters(), lr=0.1,
                                                       momentum=0.9),
                                       named_parameters=cuda_model.named_parameters())
        for model, optimizer, data in ((cpu_model, cpu_opt, inputs),
                                       (cuda_model, opt, inputs.cuda())):
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()
        error = float((cuda_model.weight.detach().cpu() - cpu_model.weight.detach()).abs().max())
        result("DistributedOptimizer step of a CUDA model", error < 1e-5, f"max error {error:.2e}")
        hvd.shutdown()
    finally:
        shard.terminate()
        shard.wait(timeout=10)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is a failure with its reason
        result("device check", False, f"{type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
