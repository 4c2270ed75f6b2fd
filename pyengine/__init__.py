"""pyengine: an inference engine and server for Qwen3.5 hybrid models.

The native library is loaded on first use of LLM, so the pure-Python modules (config,
tokenizer, templates) import without it.
"""

from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "StructuredOutputsParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":
        from .llm import LLM

        return LLM
    if name == "StructuredOutputsParams":
        from .structured_outputs import StructuredOutputsParams

        return StructuredOutputsParams
    if name == "RequestOutput":
        from .stream import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'pyengine' has no attribute {name!r}")
