"""The error of an invalid sampling parameter (its own module: sampling_params.py and structured_outputs.py both
raise it, and each imports the other's types)."""

from __future__ import annotations


class SamplingParamsError(ValueError):
    """An invalid sampling parameter; ``param`` names the field (the HTTP layer's 400 says which)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
