"""The package's exception types.

Every error a user can cause with a bad file or a bad argument is one of these (or a ValueError),
with a message that says what is wrong, where, and what to do about it.
"""

from __future__ import annotations

import os


class BrrrError(Exception):
    """Base class of llama_brrr's own errors."""


class ModelFileError(BrrrError, ValueError):
    """A model file (or directory) that is missing, truncated, corrupt or not understood.

    The message always starts with the file's path, so a user juggling several files knows which
    one is at fault: ``ModelFileError(path, "tensor 'wq' has shape ... ; re-download it")``.
    """

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):
        # The default reduce would call cls(message) and lose the two-argument signature,
        # which breaks passing these errors across processes (multiprocessing, pytest-xdist).
        return (type(self), (self.path, self.problem))


class UnsupportedModelError(ModelFileError):
    """A well-formed file describing something the engine does not run (architecture, dtype...)."""


class FetchError(BrrrError):
    """Downloading or verifying a model failed; the message says how to get the file by hand."""


class ArgumentTypeError(BrrrError, TypeError, ValueError):
    """An argument of the wrong type (`stop=123`, a float token id, `logprobs="no"`).

    The API promises a ValueError naming the parameter for every bad argument; Python's own
    convention for a wrong type is a TypeError. This is both, so either `except` catches it.
    """


class NonFiniteLogitsError(BrrrError, RuntimeError):
    """A generation step whose logits hold NaN or inf (damaged weights or an engine fault).

    Raised instead of sampling a token from them, so a NaN never comes back as text. The message
    names the step and the sequence.
    """
