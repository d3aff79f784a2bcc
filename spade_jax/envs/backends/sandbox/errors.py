"""Sandbox failures, each with a one-line message: the sandbox cannot run at all (SandboxError,
SandboxUnavailable), or a program's call raised, timed out or crashed its worker (EnvError and kin)."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """Base class of sandbox failures; the message is one line."""


class SandboxUnavailable(SandboxError):
    """The machine offers no isolation and the config does not allow running without it."""


class EnvError(SandboxError):
    """The environment program raised or broke the TextEnv contract during a call."""


class EnvTimeout(EnvError):
    """A call did not return in time; its worker was killed."""


class EnvCrashed(EnvError):
    """The worker died (signal, exit, limit) or spoke garbage; it was killed."""
