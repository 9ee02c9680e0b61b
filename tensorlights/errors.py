"""Typed errors. Callers decide by type, never by message text.

TransientError: the host is changing under us (a netlink buffer overrun, an interface gone or
    recreated, another root qdisc); retried with backoff whenever it happens.
PermanentError: this configuration cannot work on this machine as it is (a bad value, a
    kernel feature missing, a request the kernel refuses). The daemons refuse to start on it
    (exit 2 for configuration, 1 otherwise). Once the agent has had a good pass it retries these
    too, with backoff and /healthz 503: the configuration was shown to work here, so the
    failure comes from the host changing (an operator's edit), and exiting would only drop the
    shaping that still works (agent/app.py).
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


class InterfaceNotFoundError(TransientError):
    """The interface named in the configuration does not exist (it may come back: deleted and
    recreated, renamed)."""


class LinkRateUnknownError(ConfigError):
    """The link rate could not be read from the kernel and none was configured."""


class ForeignQdiscError(TransientError):
    """Another root qdisc is installed and we were not told to take it over (not fought: it
    may be removed again)."""


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
