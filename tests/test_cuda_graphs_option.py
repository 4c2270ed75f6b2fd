"""The engine option cuda_graphs (replays CUDA decode steps from graphs) on a CPU model: refused
at engine creation with a message that names the device it needs. Runs everywhere (no GPU)."""

import pytest

from pyengine import LLM
from pyengine.llm import default_model_path


def test_cuda_graphs_on_the_cpu_is_refused_with_a_clear_message():
    with pytest.raises(Exception, match="cuda_graphs needs device 'cuda'"):
        LLM(default_model_path(), device="cpu", cuda_graphs=True, max_model_len=64)
