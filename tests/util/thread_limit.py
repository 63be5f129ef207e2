"""Commands run as user nobody under a thread limit (RLIMIT_NPROC, which
root is not held to): how the tests see what a process does when the system
refuses it a thread."""

import os
import shutil
import subprocess

import pytest

AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def skip_unless_nobody_may(*test_args, what):
    """Skips the test unless this process can run commands as nobody under a
    thread limit and `test *test_args` passes as nobody (`what` says what that
    checks, for the skip's reason)."""
    if os.geteuid() != 0 or not (shutil.which("prlimit") and shutil.which("setpriv")):
        pytest.skip("needs root, prlimit and setpriv to run as nobody under RLIMIT_NPROC")
    if subprocess.run([*AS_NOBODY, "test", *test_args]).returncode != 0:
        pytest.skip(f"user nobody cannot {what}")


def as_nobody_limited(limit, *command):
    """`command` run as nobody, its user allowed `limit` threads."""
    return ["prlimit", f"--nproc={limit}", *AS_NOBODY, *command]
