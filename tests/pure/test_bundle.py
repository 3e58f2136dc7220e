"""multicall.effects.bundle: the environment of host programs an applet starts."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from multicall.applets import netns_exec
from multicall.effects import process
from multicall.effects.bundle import bundle_root, child_environ


def test_child_environ_drops_only_the_bundled_locpath() -> None:
    bundled = {"LOCPATH": os.path.join(bundle_root(), "locale"), "PATH": "/bin"}
    assert child_environ(bundled) == {"PATH": "/bin"}
    host = {"LOCPATH": "/usr/share/my-locales", "PATH": "/bin"}
    assert child_environ(host) == host


def test_netns_exec_hands_programs_the_callers_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program run by netns-exec gets the caller's environment without the launcher's
    LOCPATH (util-linux nsenter adds nothing either)."""
    seen: list[dict[str, str]] = []

    def exec_program(argv: object, env: dict[str, str]) -> NoReturn:
        seen.append(env)
        raise SystemExit(0)

    monkeypatch.setattr(process, "exec_program", exec_program)
    bundled = {"LOCPATH": os.path.join(bundle_root(), "locale"), "PATH": "/bin", "X": "1"}
    with pytest.raises(SystemExit):
        netns_exec.execute(["true"], bundled)
    assert seen == [{"PATH": "/bin", "X": "1"}]
