"""User-facing errors: one line that names the problem and the fix."""
from __future__ import annotations


class AdafuseError(Exception):
    """Base class of errors caused by user input (bad name, config, data path...).

    The CLI prints these as a single `error: ...` line and exits with status 2.
    """


class UnknownModelError(AdafuseError, KeyError):
    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class ModelNotFetchedError(AdafuseError, FileNotFoundError):
    pass


class InsufficientMemoryError(AdafuseError, MemoryError):
    pass


class TokenizerMismatchError(AdafuseError, ValueError):
    pass


class ConfigError(AdafuseError, ValueError):
    pass


class NonFiniteLogitsError(AdafuseError, FloatingPointError):
    """A member's forward gave NaN or infinite logits (an overflow, or broken weights)."""
