"""Regenerates every golden into a temporary folder and compares it, byte for
byte, with the committed tests/golden/ and tests/golden-pending/: the same
variants, the same files, the same bytes. Exits non-zero (listing what
differs) otherwise, so a change to the reference that moves any golden, or a
golden edited by hand, is caught.

Usage: /usr/bin/python3 tools/reference/check_goldens.py
"""
import filecmp
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def variants(folder):
    if not os.path.isdir(folder):
        return {}
    return {d: sorted(os.listdir(os.path.join(folder, d))) for d in sorted(os.listdir(folder))
            if os.path.isdir(os.path.join(folder, d))}


def compare(committed, fresh, label):
    problems = []
    want, got = variants(committed), variants(fresh)
    for name in sorted(set(want) | set(got)):
        if name not in got:
            problems.append(f"{label}/{name}: committed but no longer generated")
            continue
        if name not in want:
            problems.append(f"{label}/{name}: generated but not committed")
            continue
        if want[name] != got[name]:
            problems.append(f"{label}/{name}: files {want[name]} committed, {got[name]} generated")
            continue
        for f in got[name]:
            if not filecmp.cmp(os.path.join(committed, name, f), os.path.join(fresh, name, f), shallow=False):
                problems.append(f"{label}/{name}/{f}: bytes differ")
    return problems, len(got)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        golden, pending = os.path.join(tmp, "golden"), os.path.join(tmp, "golden-pending")
        run = subprocess.run([sys.executable, os.path.join(HERE, "make_goldens.py"), "--out", golden,
                              "--pending-out", pending], capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout + run.stderr)
            print("FAIL make_goldens.py exited with", run.returncode)
            return 1
        p1, n1 = compare(os.path.join(ROOT, "tests", "golden"), golden, "tests/golden")
        p2, n2 = compare(os.path.join(ROOT, "tests", "golden-pending"), pending, "tests/golden-pending")
    for p in p1 + p2:
        print("FAIL " + p)
    if p1 or p2:
        print(f"{len(p1) + len(p2)} differences: regenerate with tools/reference/make_goldens.py "
              "if the change is intended")
        return 1
    print(f"ok   {n1} goldens in tests/golden and {n2} in tests/golden-pending regenerate byte for byte")
    return 0


if __name__ == "__main__":
    sys.exit(main())
