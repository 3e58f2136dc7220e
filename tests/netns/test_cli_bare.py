"""Every applet of the applet table run with no arguments at all (docs/cli.md), as a user
typing its name would: it does its documented default, or fails with one line in its own
voice, never a traceback; a daemon keeps running until SIGTERM and then exits 0.

Some applets do real work with no arguments (netns-exec runs a shell, install-cni and the
node agent start their daemons), so each runs in a throwaway mount and network namespace
with empty tmpfs over /run, /etc/cni, /opt/cni and /var/lib/cni: whatever it writes or
binds vanishes with the namespace. New rows of the applet table are picked up as they land.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from multicall.applet import Applet
from multicall.applets import APPLETS
from tests.support import cnibox_argv, require_root, require_tool

SCRATCH = ("/run", "/etc/cni", "/opt/cni", "/var/lib/cni")
DAEMON_GRACE = 8.0  # a one-shot run ends well within this; still running means a daemon
STOP_WITHIN = 40.0


def sandboxed(argv: list[str]) -> list[str]:
    mounts = "; ".join(f"[ -d {d} ] && mount -t tmpfs cnibox-bare {d}" for d in SCRATCH)
    script = f'{mounts}; exec "$@"'
    return ["unshare", "--mount", "--net", "--propagation", "private", "--", "sh", "-c", script,
            "sh", *argv]  # fmt: skip


@pytest.mark.parametrize("applet", APPLETS, ids=lambda applet: applet.name)
def test_no_arguments(applet: Applet) -> None:
    """No arguments, an empty environment but PATH, stdin at EOF."""
    require_root()
    require_tool("unshare")
    env = {"PATH": os.environ["PATH"], "CI": os.environ.get("CI", "")}
    proc = subprocess.Popen(
        sandboxed(cnibox_argv(applet.name)),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=DAEMON_GRACE)
        daemon = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=STOP_WITHIN)
        daemon = True
    assert "Traceback" not in err + out, err
    assert proc.returncode not in (70, -signal.SIGTERM), (proc.returncode, err)
    if daemon:
        assert proc.returncode == 0, f"{applet.name}: exit {proc.returncode} on SIGTERM\n{err}"
        return
    if applet.parses_help:
        return  # another program's convention: tests/pure/test_cli_convention.py FOREIGN
    for line in err.splitlines():
        # the dispatcher's `NAME: message` and Try line, or the applet's log lines
        assert line.startswith((f"{applet.name}: ", "Try '", "time=")), err
    if proc.returncode == 2:
        assert err.endswith(f"Try '{applet.name} --help' for more information.\n"), err
