"""The binary's self-test probes: behaviours of the compiled file that only a running binary
shows, for tests (tests/binary, tests/arm64) and docs/binary.md. Test-only: reached through
`cnibox --selftest-signal` / `--selftest-inspect`, never listed in `--help`; kept out of the
dispatcher, which only looks them up here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from typing import BinaryIO

from multicall.effects.streams import write_text
from multicall.errors import EXIT_FAILURE, EXIT_OK

SIGTERM_EXIT = 42


def signal_probe(stdout: BinaryIO) -> int:
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


def inspect_probe(stdout: BinaryIO) -> int:
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
    signature = str(inspect.signature(inspect_probe))
    write_text(stdout, f"{' '.join(states)} {signature}\n")
    expected = [inspect.GEN_CREATED, inspect.GEN_SUSPENDED, inspect.GEN_CLOSED]
    return EXIT_OK if states == expected else EXIT_FAILURE


PROBES: dict[str, Callable[[BinaryIO], int]] = {
    "--selftest-signal": signal_probe,
    "--selftest-inspect": inspect_probe,  # inspect imported late (docs/binary.md)
}
