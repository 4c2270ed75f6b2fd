"""A tensor-parallel worker rank (started by pyengine.tp.TpGroup): joins the group, loads its shard
of the checkpoint and serves rank 0's forwards until rank 0 stops the group.

Exit codes: 0 stopped by rank 0; 1 failed (the reason went to the group, so rank 0's engine reports
it, and to stderr).
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pyengine.tp_worker", description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--weight_quant", default=None)
    p.add_argument("--load_format", default="auto")
    p.add_argument("--prefill_weight_copy", default="auto", choices=["auto", "on", "off"])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--nccl_id", default=None, help="the NCCL group id rank 0 made, in hex")
    a = p.parse_args(argv)

    from ._native import native
    from .config import ModelConfig
    from .model_loader import NativeModel
    from .tp import Comm

    control = Comm.cpu(a.group, a.rank, a.size)
    try:
        data = Comm.nccl(bytes.fromhex(a.nccl_id), a.rank, a.size) if a.nccl_id else control
        config = ModelConfig.from_dir(a.model)
        copy = None if a.prefill_weight_copy == "auto" else a.prefill_weight_copy == "on"
        model = NativeModel(a.model, config, a.device, weight_quant=a.weight_quant, load_format=a.load_format,
                            tp=(data, control), prefill_weight_copy=copy)  # fmt: skip
        n = native()
        n.check(n.lib.pe_model_serve_tp_worker(model.handle), "tensor-parallel worker")
    except Exception as e:  # noqa: BLE001 (any failure ends the group with its reason)
        why = f"rank {a.rank}: {e}"
        control.abort(why)
        print(f"pyengine tp worker {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
