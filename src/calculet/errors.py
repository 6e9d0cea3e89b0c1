"""Typed errors with stable codes.

Every error Calculet raises on purpose is a `CalculetError`: it carries a stable `code` (a short
snake_case string that tests and clients can match on), a `kind` (who must act: the caller's
request, the model/package, or the device), and a message that says what was wrong and the limit.
The CLI prints `error[code]: message` on one line; the server maps `kind` to an HTTP status.
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(str, Enum):
    REQUEST = "request"  # the caller asked for something invalid (fix the input)
    MODEL = "model"      # the model source or calbin is wrong (fix the package)
    DEVICE = "device"    # the runtime/execution provider failed (retry or rebuild the session)


class CalculetError(Exception):
    """Base class. Subclasses fix `kind`; every raise site names a stable `code`."""

    kind: ErrorKind = ErrorKind.REQUEST

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def one_line(self) -> str:
        return f"error[{self.code}]: {self.message}"


class RequestError(CalculetError):
    kind = ErrorKind.REQUEST


class ModelError(CalculetError):
    kind = ErrorKind.MODEL


class DeviceError(CalculetError):
    kind = ErrorKind.DEVICE
