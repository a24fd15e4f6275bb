"""harrier_python_test: a Python test run by run_python_test.sh with
Debian's /usr/bin/python3, the built package and real shards."""

def harrier_python_test(name, size = "medium", data = []):
    native.sh_test(
        name = name,
        size = size,
        srcs = ["run_python_test.sh"],
        args = [name + ".py"],
        data = [
            name + ".py",
            "harrier_testing.py",
            "//python:package",
            "//server:harrier-server",
        ] + data,
        # An ASan-built extension cannot load into an uninstrumented
        # interpreter: not under the sanitizers.
        tags = ["no_sanitizers"],
    )
