"""usage: selftest signal|inspect

Probes of the built binary for its tests (tests/binary, tests/arm64) and docs/binary.md's
checks; not listed by `cnibox --list` or `--help`, not installed as a link.

  signal    print `ready PID`, then exit 42 on SIGTERM (130 on SIGINT), 1 after 60 s: a
            signal reaches a Python handler in compiled code
  inspect   import `inspect` late, as the binary does (build/lazy_inspect.py), and print a
            compiled generator's states and a signature; 0 when the states are right
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping, Sequence
from typing import BinaryIO

from multicall.effects.streams import write_text
from multicall.errors import EXIT_FAILURE, EXIT_OK, UsageError

SIGTERM_EXIT = 42


def main(argv: Sequence[str], env: Mapping[str, str],
         stdin: BinaryIO, stdout: BinaryIO, stderr: BinaryIO) -> int:  # fmt: skip
    probes = {"signal": probe_signal, "inspect": probe_inspect}
    if len(argv) != 2 or argv[1] not in probes:
        raise UsageError("expected one probe: signal or inspect")
    return probes[argv[1]](stdout)


def probe_signal(stdout: BinaryIO) -> int:
    """Wait up to 60 s for SIGTERM (-> 42) or SIGINT (-> KeyboardInterrupt, 130).

    Compiled code has no eval loop: Nuitka runs Python handlers at loop iterations and
    where C code checks (an interrupted system call, signal.pthread_sigmask, os.kill), not
    between two plain calls. A signal arriving just before a plain sleep waited for the
    sleep to end (seen under the binary); the wakeup fd catches it.
    """
    import select
    import signal

    class Terminated(Exception):
        pass

    def on_sigterm(signum: int, frame: object) -> None:
        raise Terminated

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        write_text(stdout, f"ready {os.getpid()}\n")  # the handler may already run in here
        select.select([read_end], [], [], 60)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])  # runs pending handlers
    except Terminated:
        return SIGTERM_EXIT
    return EXIT_FAILURE


def probe_inspect(stdout: BinaryIO) -> int:
    """Import `inspect` late, as the binary now does (build/lazy_inspect.py), and check that
    Nuitka's patch for compiled generators ran with it: stock `getgeneratorstate` reads
    attributes compiled generators lack. Prints the states seen; 0 when they are right."""
    import inspect

    def numbers() -> Generator[int, None, None]:
        yield 1

    gen = numbers()
    states = [inspect.getgeneratorstate(gen)]
    next(gen)
    states.append(inspect.getgeneratorstate(gen))
    gen.close()
    states.append(inspect.getgeneratorstate(gen))
    signature = str(inspect.signature(probe_inspect))
    write_text(stdout, f"{' '.join(states)} {signature}\n")
    expected = [inspect.GEN_CREATED, inspect.GEN_SUSPENDED, inspect.GEN_CLOSED]
    return EXIT_OK if states == expected else EXIT_FAILURE
