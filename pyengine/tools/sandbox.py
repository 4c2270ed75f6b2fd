"""Run model-written Python against its tests in a child process with limits.

The child is `python -I` (no user site, no environment), in an empty temporary directory,
with an empty environment, its own session (the whole group is killed at the wall-time
limit) and resource limits it sets on itself before the code runs: address space, CPU
seconds, file size, open files, no core dumps. The limits are set inside the child rather than
through preexec_fn, which is unsafe while the harness runs requests on several threads.
This stops runaway code (loops, memory, disk), not a determined attacker: it is not a
security boundary; run untrusted evals in a container.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# Runs in the child: limit itself, then execute the program file as __main__.
_LIMITER = """
import resource, sys
mem, cpu, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
for what, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                    (resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_NOFILE, 64),
                    (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(what, (value, value))
source = open(path).read()
sys.argv = [path]
exec(compile(source, path, "exec"), {"__name__": "__main__"})
"""


@dataclass
class RunResult:
    passed: bool
    status: str  # passed, failed, timeout, error
    detail: str  # the end of stderr (the assertion or exception)


def run_python(source: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="pyengine-eval-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        cpu_s = max(1, int(timeout_s) + 1)
        cmd = [sys.executable, "-I", "-c", _LIMITER, str(memory_mb << 20), str(cpu_s), path]
        proc = subprocess.Popen(cmd, cwd=tmp, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return RunResult(False, "timeout", f"no result after {timeout_s:g} s")
    tail = err.decode(errors="replace").strip().splitlines()[-3:]
    if proc.returncode == 0:
        return RunResult(True, "passed", "")
    if proc.returncode < 0:
        return RunResult(False, "error", f"killed by signal {-proc.returncode} " + " | ".join(tail))
    return RunResult(False, "failed", " | ".join(tail))
