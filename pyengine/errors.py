"""Exceptions of the pure-Python side that callers are expected to catch."""


class CheckpointError(ValueError):
    """A checkpoint directory, config.json or safetensors file is missing or malformed.

    The message always names the file and, where there is one, the field or tensor at fault,
    because the person who reads it usually has to go and fix that file by hand.
    """


class EngineError(RuntimeError):
    """The native engine failed (status < 0 from pyengine.h); the message is pe_last_error()."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class CapacityError(MemoryError):
    """The memory plan cannot fit the asked configuration; the message gives the numbers."""


class PromptTooLongError(ValueError):
    """A prompt has more tokens than `limit` (found by counting characters or tokens, before the
    whole text was tokenized when it is far over). n_tokens is None when characters decided."""

    def __init__(self, message: str, limit: int, n_tokens: int | None = None):
        super().__init__(message)
        self.limit = limit
        self.n_tokens = n_tokens
