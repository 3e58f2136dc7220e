"""The one error hierarchy of cnibox, and where each error ends up.

Rules of this module:
1. Every failure an applet expects is a `CniboxError` subclass carrying keyword-only context.
2. Exit codes are decided here, by the class (`exit_code`), and applied in one place:
   `multicall.dispatch.run_applet`. The CNI applet is the one other boundary: it turns
   errors into CNI error JSON via `cni_code`.
3. Anything that is not a `CniboxError` is a bug: the dispatcher reports it in one line
   (never a traceback, unless CNIBOX_DEBUG is set) and exits with `EXIT_INTERNAL`.

    CniboxError                      exit 1   generic failure of the applet
     ├── UsageError                  exit 2   bad command line (applets may override)
     ├── ConfigError                 exit 1   bad input document; CNI code 6/7
     ├── NetnsError                  exit 1   a namespace cannot be opened or entered
     │    └── NetnsNotFound                   DEL treats it as success
     ├── FirewallError               exit 1   the kernel refused a rule set
     │    └── FirewallConflict                the table changed under a change: plan again
     ├── KubeError                   exit 1   the Kubernetes API failed or refused
     ├── UnreadableInput             exit 1   an input is missing, not a regular file, or
     │                                        over its limit (core/limits.py); CNI code 5
     ├── RulesetMismatch             exit 1   verifier: actual differs from expected
     ├── CommandFailed               exit 1   a child process failed (argv, rc, stderr)
     ├── ExecFailed                  exit 126 a program could not be executed
     │    └── ExecNotFound           exit 127 ... because it does not exist
     ├── CniError                    exit 1   a CNI protocol error with an explicit code
     ├── UpstreamFatal               exit 1   a failure upstream's Go component ends with
     │                                        log.Fatal: logged as that line (message, error)
     └── ServeElsewhere              exit 1   a node agent's worker cannot serve this request
                                              (nothing changed): its caller runs it itself
"""

from __future__ import annotations

from typing import ClassVar

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug, not the user's fault
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127
EXIT_INTERRUPTED = 130

# CNI spec error codes (SPEC.md "Error"), plus upstream's "internal" code.
CNI_INCOMPATIBLE_VERSION = 1
CNI_UNSUPPORTED_FIELD = 2
CNI_UNKNOWN_CONTAINER = 3
CNI_INVALID_ENV = 4
CNI_IO_FAILURE = 5
CNI_DECODING_FAILURE = 6
CNI_INVALID_NETWORK_CONFIG = 7
CNI_INVALID_NETNS = 8
CNI_TRY_AGAIN = 11
CNI_NOT_READY = 50
CNI_INTERNAL = 999


class CniboxError(Exception):
    """Base of every expected failure; `str()` is the user-facing message."""

    exit_code: ClassVar[int] = EXIT_FAILURE
    cni_code: ClassVar[int] = CNI_INTERNAL

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        path: str | None = None,
        netns: str | None = None,
        table: str | None = None,
        chain: str | None = None,
        errno: int | None = None,
        details: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.path = path
        self.netns = netns
        self.table = table
        self.chain = chain
        self.errno = errno
        self.details = details


class UsageError(CniboxError):
    """The command line is wrong; the applet's usage text should follow."""

    exit_code = EXIT_USAGE


class ConfigError(CniboxError):
    """An input document (network config, kubeconfig, pod, save text) is invalid."""

    cni_code = CNI_DECODING_FAILURE


class NetnsError(CniboxError):
    """A namespace could not be opened, entered or left."""

    cni_code = CNI_INVALID_NETNS


class NetnsNotFound(NetnsError):
    """The namespace path does not exist (DEL treats this as success)."""


class FirewallError(CniboxError):
    """The kernel (or a backend) refused a rule set or a dump."""


class FirewallConflict(FirewallError):
    """The table changed between reading it and committing a change planned from it; nothing
    was changed. The firewall engine plans again from a fresh read (bounded retries)."""


class KubeError(CniboxError):
    """The Kubernetes API could not be reached, timed out, or answered with an error."""


class UnreadableInput(CniboxError):
    """A file or stream could not be read within bounds: missing, unreadable, not a regular
    file (a FIFO, device, directory), or larger than its limit (effects/inputs.py)."""

    cni_code = CNI_IO_FAILURE


class RulesetMismatch(CniboxError):
    """The actual rules differ from the expected ones; `details` holds the readable diff."""


class CommandFailed(CniboxError):
    """A child process failed."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"{argv[0]} exited with status {returncode}", details=stderr)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


class ExecFailed(CniboxError):
    """exec of a program failed (util-linux/POSIX shell convention: 126)."""

    exit_code = EXIT_CANNOT_EXEC


class ExecNotFound(ExecFailed):
    """exec failed because the program does not exist (ENOENT: 127)."""

    exit_code = EXIT_NOT_FOUND


class CniError(CniboxError):
    """A CNI protocol error whose code is chosen by the raiser, not by the class."""

    def __init__(self, code: int, message: str, details: str = "") -> None:
        super().__init__(message, details=details)
        self.code = code


class UpstreamFatal(CniboxError):
    """A failure upstream's component ends with logrus' `Fatal` (exit 1): the applet logs it
    as that line, level `fatal`, upstream's message and its Go error text as the `error`
    field, so log queries written for upstream's line still match."""

    def __init__(self, message: str, error: str) -> None:
        super().__init__(message, details=error)
        self.error = error


class ServeElsewhere(CniboxError):
    """The request must be served by the caller's own one-shot path: the process serving it
    (a node agent's worker) would need more than it has (a privilege, the other family's
    x_tables extensions, openat2), and nothing was changed yet. Only raised where a `Files`,
    a netns handed over or a single-use x_tables process (all passed explicitly) says the
    process serves another; `plugin/run.run_plugin` returns it as
    `PluginResult.served_elsewhere`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def cni_code_of(exc: BaseException) -> int:
    """The CNI error code an exception maps to (999 for anything unexpected)."""
    if isinstance(exc, CniError):
        return exc.code
    if isinstance(exc, CniboxError):
        return exc.cni_code
    return CNI_INTERNAL
