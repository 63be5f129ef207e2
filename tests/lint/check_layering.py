"""Checks the layering of the C++ sources by reading their includes.

Each folder may include only the folders listed for it (docs/design.md,
"Layers and targets"): a layer never includes one above it, and only
kernels/backends.cc names a concrete backend (kernels/<device>/). Tests are
free to include anything: they test the backends themselves.

Usage: check_layering.py [REPO_ROOT]   (exit 1 and one line per violation)
"""
import pathlib
import re
import subprocess
import sys

# Folder (or file) prefix -> prefixes of our headers it may include. The
# longest matching prefix applies. Includes that do not start with one of
# OURS (system, third-party, generated protobuf headers) are not checked.
ALLOWED = {
    "engine/text/": ["engine/text/"],
    "engine/model/": ["engine/model/", "engine/text/"],
    "engine/moe/": ["engine/moe/", "engine/model/"],
    "engine/runtime/": ["engine/runtime/", "engine/moe/", "engine/model/", "engine/text/"],
    "kernels/backends.": ["kernels/", "engine/"],
    "kernels/": ["engine/"],  # plus the backend's own folder, see allowed_for()
    "server/": ["server/", "engine/", "kernels/backends.h"],
    "bench/": ["bench/", "server/", "engine/", "kernels/backends.h", "tests/util/"],
    # Kernel benchmarks time a backend's own kernels, as its tests check them.
    "bench/matmul_bench.cc": ["bench/", "engine/", "kernels/"],
    "tests/": ["tests/", "server/", "engine/", "kernels/", "bench/"],
}
OURS = ("engine/", "kernels/", "server/", "bench/", "tests/", "tools/")
# System headers only the CPU backend (and the benchmarks' machine-limit
# measurements, and the emulated cuBLAS of the SIMT executor, which maps
# cuBLAS calls onto OpenBLAS) may use: BLAS and OpenMP stay out of the engine.
HOST_MATH = {"cblas.h", "omp.h"}
HOST_MATH_ALLOWED = ("kernels/cpu/", "bench/", "kernels/cuda/gemm_emulated.cc")

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def allowed_for(path: str):
    prefix = max((p for p in ALLOWED if path.startswith(p)), key=len, default=None)
    if prefix is None:
        return None
    allowed = list(ALLOWED[prefix])
    if prefix == "kernels/":
        # A backend's own folder: kernels/<device>/.
        allowed.append("/".join(path.split("/")[:2]) + "/")
    return allowed


def violations(root: pathlib.Path):
    files = subprocess.run(["git", "ls-files", "*.cc", "*.h", "*.cu", "*.cuh"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    for path in files:
        allowed = allowed_for(path)
        if allowed is None:
            continue
        text = (root / path).read_text(errors="replace")
        for match in INCLUDE.finditer(text):
            kind, header = match.groups()
            line = text.count("\n", 0, match.start()) + 1
            if kind == "<":
                if header in HOST_MATH and not path.startswith(HOST_MATH_ALLOWED):
                    yield f"{path}:{line}: includes <{header}>; only {HOST_MATH_ALLOWED} may"
                continue
            if header.startswith(OURS) and not header.startswith(tuple(allowed)):
                yield f"{path}:{line}: includes \"{header}\"; {path} may include only {allowed}"


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    found = list(violations(root))
    for v in found:
        print(v)
    print(f"layering: {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
