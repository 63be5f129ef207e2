"""A script of bench/ imported as a module, for the tests of its pieces."""

import importlib
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def import_bench_script(name):
    # compare_pytorch (which the scripts import) would start the process
    # again for OpenBLAS's kernels unless told to keep the environment.
    argv = sys.argv
    sys.argv = [f"{name}.py", "--keep-openblas-coretype"]
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.argv = argv
        sys.path.remove(str(ROOT / "bench"))
