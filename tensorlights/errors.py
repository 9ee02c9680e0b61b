"""Typed errors. Callers decide by type, never by message text.

TransientError: worth retrying with backoff (netlink buffer overrun, interface flapping).
PermanentError: retrying cannot help; surface it to the operator with what to do.
"""

from __future__ import annotations


class TensorLightsError(Exception):
    """Base of every error this package raises on purpose."""


class TransientError(TensorLightsError):
    """Retry with backoff."""


class PermanentError(TensorLightsError):
    """Stop and tell the operator."""


class ConfigError(PermanentError):
    """The configuration or a command-line value is invalid."""


class InterfaceNotFoundError(PermanentError):
    """The interface named in the configuration does not exist."""


class LinkRateUnknownError(ConfigError):
    """The link rate could not be read from the kernel and none was configured."""


class ForeignQdiscError(PermanentError):
    """Another root qdisc is installed and we were not told to take it over."""


class UnsupportedKernelError(PermanentError):
    """The running kernel lacks a feature the configuration asks for."""


class NetlinkRequestError(PermanentError):
    """The kernel refused a request; carries errno and what was being done."""

    def __init__(self, what: str, errno: int, detail: str = "") -> None:
        self.what = what
        self.errno = errno
        self.detail = detail
        text = f"{what}: kernel said errno {errno}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class NetlinkResyncNeededError(TransientError):
    """A dump was interrupted or the socket overran (ENOBUFS): read everything again."""
