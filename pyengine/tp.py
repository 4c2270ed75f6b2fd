"""Tensor parallel, one process per rank: rank 0 is this process (the engine, the scheduler and the
Python front end); ranks 1 .. N-1 are worker processes (pyengine.tp_worker) that load their weight
shards and serve rank 0's forwards until it stops them.

The ranks meet in a CPU communicator (shared memory, named by a token passed on the command line)
that carries rank 0's messages; on CUDA the forward's all-reduces go through NCCL, whose group id
rank 0 makes and passes the same way. Worker rank r uses GPU r (of CUDA_VISIBLE_DEVICES when set).
A worker that dies or fails makes rank 0's next step fail with its reason, and `error` reports it
(the server's /health turns 503); a dead rank 0 makes the workers exit.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading

from ._native import native

JOIN_TIMEOUT_S = 120.0


class Comm:
    """A pe_comm handle."""

    def __init__(self, handle):
        self._n = native()
        self.handle = self._n.ffi.gc(handle, self._n.lib.pe_comm_free)

    @classmethod
    def cpu(cls, name: str, rank: int, size: int, join_timeout_s: float = JOIN_TIMEOUT_S) -> Comm:
        n = native()
        out = n.ffi.new("pe_comm**")
        n.check(n.lib.pe_comm_create_cpu(name.encode(), rank, size, join_timeout_s, out), "tensor-parallel group")
        return cls(out[0])

    @staticmethod
    def nccl_unique_id() -> bytes:
        n = native()
        buf = n.ffi.new("uint8_t[128]")
        n.check(n.lib.pe_nccl_unique_id(buf), "NCCL")
        return bytes(n.ffi.buffer(buf, 128))

    @classmethod
    def nccl(cls, unique_id: bytes, rank: int, size: int) -> Comm:
        n = native()
        out = n.ffi.new("pe_comm**")
        n.check(n.lib.pe_comm_create_nccl(n.ffi.from_buffer(unique_id), rank, size, out), "NCCL communicator")
        return cls(out[0])

    def abort(self, why: str) -> None:
        self._n.lib.pe_comm_abort(self.handle, why.encode("utf-8", "replace"))

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            self._n.ffi.release(handle)


def group_of_one() -> bool:
    """PYENGINE_TP_GROUP_OF_ONE=1: tensor_parallel_size 1 still runs through a group, of one rank
    (its all-reduces and logits gather through NCCL on CUDA), so one GPU runs the TP path; the GPU
    tests run this way too (tools/gpu/pytest_gpu.sh TP1=1)."""
    return os.environ.get("PYENGINE_TP_GROUP_OF_ONE", "") == "1"


def threads_per_rank(size: int, asked: int = 0) -> int:
    """CPU threads each rank uses: the asked number, or this machine's cores shared out."""
    return asked if asked > 0 else max(1, (os.cpu_count() or 1) // size)


def worker_gpu(rank: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [d for d in visible.split(",") if d.strip()] if visible else None
    if ids is not None and rank >= len(ids):
        raise ValueError(f"tensor_parallel_size needs GPU {rank} but CUDA_VISIBLE_DEVICES={visible} has {len(ids)}")
    return ids[rank] if ids is not None else str(rank)


class TpGroup:
    """Rank 0's side: starts the workers and holds the communicators (`data`, `control`)."""

    def __init__(self, model_dir: str, size: int, device: str, weight_quant: str | None, load_format: str,
                 num_threads: int = 0, prefill_weight_copy: bool | None = None):  # fmt: skip
        if size < 1:
            raise ValueError(f"a tensor-parallel group needs at least 1 rank, got {size}")
        self.size = size
        self.error: str | None = None
        self._closing = False
        self.name = f"{os.getpid()}-{secrets.token_hex(6)}"
        nccl_id = Comm.nccl_unique_id() if device == "cuda" else None
        threads = threads_per_rank(size, num_threads)
        self._procs: list[subprocess.Popen] = []
        try:
            for rank in range(1, size):
                cmd = [sys.executable, "-m", "pyengine.tp_worker", "--model", model_dir, "--rank", str(rank),
                       "--size", str(size), "--group", self.name, "--device", device, "--load_format", load_format,
                       "--threads", str(threads)]  # fmt: skip
                if weight_quant:
                    cmd += ["--weight_quant", weight_quant]
                if prefill_weight_copy is not None:
                    cmd += ["--prefill_weight_copy", "on" if prefill_weight_copy else "off"]
                if nccl_id is not None:
                    cmd += ["--nccl_id", nccl_id.hex()]
                env = dict(os.environ, PYENGINE_NUM_THREADS=str(threads))
                if device == "cuda":
                    env["CUDA_VISIBLE_DEVICES"] = worker_gpu(rank)
                self._procs.append(subprocess.Popen(cmd, env=env))
            self.control = Comm.cpu(self.name, 0, size)
            self.data = Comm.nccl(nccl_id, 0, size) if nccl_id is not None else self.control
        except BaseException:
            self.close()
            raise
        self._watch = threading.Thread(target=self._watch_workers, name="pyengine-tp-watch", daemon=True)
        self._watch.start()

    def _watch_workers(self) -> None:
        for rank, proc in enumerate(self._procs, start=1):
            code = proc.wait()
            if not self._closing and self.error is None:
                self.error = f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {code}"
                return

    def close(self, timeout_s: float = 10.0) -> None:
        """After rank 0's model is freed (which stops the workers), or when the group failed to
        start: leaves the group (a worker still waiting sees rank 0 gone and exits), waits for the
        workers, and ends any that do not stop."""
        self._closing = True
        for comm in (getattr(self, "data", None), getattr(self, "control", None)):
            if comm is not None:
                comm.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
