"""The plugin's log lines (docs/linkerd-cni.md "Logs"): every failure once at error level
with the pod's fields, the config at debug with secrets redacted, the optional log file.

Through the seam (multicall.plugin.run_plugin) with the fake API and firewall: no root.
"""

from __future__ import annotations

import io
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from multicall.core import logs
from multicall.effects.log import LogFile, Logger
from tests.pure.test_plugin_seam import KUBECONFIG, PREV, Node, config, env
from tests.support.logfmt import errors, parse_line, records
from tests.support.pods import MESHED, NS, renamed

POD = MESHED["metadata"]["name"]
POD_FIELDS = {"ContainerID": "c0ffee", "Namespace": NS, "Pod": POD}
REFUSED = (
    f'Get "https://10.96.0.1:443/api/v1/namespaces/{NS}/pods/{POD}": '
    "dial tcp 10.96.0.1:443: connect: connection refused"
)


def plain_config(**keys: Any) -> bytes:
    """The chart's config as the installer writes it: no log_level (upstream's warn)."""
    doc = json.loads(config())
    del doc["log_level"]
    doc.update(keys)
    return json.dumps(doc).encode()


def refuse_api(node: Node) -> bytes:
    node.kube.failure = REFUSED
    return plain_config()


def unauthorized(node: Node) -> bytes:
    node.kube.failure = "Unauthorized"
    return plain_config()


def kubeconfig_missing(node: Node) -> bytes:
    node.kube.kubeconfigs = frozenset()
    return plain_config()


def bad_annotation(node: Node) -> bytes:
    node.kube.add_pod(renamed(MESHED, POD, **{"config.linkerd.io/proxy-uid": "21O2"}))
    return plain_config()


def rule_error(node: Node) -> bytes:
    node.firewall.refusal = "host/network `10.0.0.0' not found"
    return plain_config()


FAILURES: dict[str, tuple[Callable[[Node], bytes], str, str]] = {
    # class: (set-up, the step named in the log line, the CNI error's msg)
    "API refused": (refuse_api, f"reading pod {NS}/{POD} from the Kubernetes API", REFUSED),
    "unauthorized": (
        unauthorized,
        f"reading pod {NS}/{POD} from the Kubernetes API",
        "Unauthorized",
    ),
    "kubeconfig missing": (
        kubeconfig_missing,
        f"loading the kubeconfig {KUBECONFIG}",
        f"stat {KUBECONFIG}: no such file or directory",
    ),
    "bad annotation": (
        bad_annotation,
        "applying the pod's config.linkerd.io annotations",
        'strconv.Atoi: parsing "21O2": invalid syntax',
    ),
    "rule error": (
        rule_error,
        "programming the firewall in /var/run/netns/cbx-seam-pod",
        "host/network `10.0.0.0' not found",
    ),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_each_add_failure_is_one_error_line_with_the_pod_fields(failure: str) -> None:
    """Each failure class of ADD: exactly one error line, with ContainerID, Namespace and
    Pod, naming the step and carrying the CNI error's message, at the default level."""
    node = Node()
    set_up, step, message = FAILURES[failure]
    result = node.run("ADD", set_up(node))
    assert result.exit_code == 1
    assert json.loads(result.stdout)["msg"] == message
    (line,) = errors(node.logs)
    assert {k: line[k] for k in POD_FIELDS} == POD_FIELDS
    assert line["msg"] == f"linkerd-cni: ADD failed while {step}: {message}"
    assert records(node.logs) == [line]  # warn level: nothing but the failure


def test_failures_before_cni_args_are_parsed_carry_the_fields_too() -> None:
    """A config that does not decode is logged with the pod's fields read from the raw
    environment (upstream logs it without them)."""
    node = Node()
    result = node.run("ADD", b'{"cniVersion":"1.0.0","name":"n","linkerd":{"ipv6":"yes"}}')
    assert result.exit_code == 1
    (line,) = errors(node.logs)
    assert {k: line[k] for k in POD_FIELDS} == POD_FIELDS
    assert line["msg"].startswith("linkerd-cni: ADD failed while parsing the network config: ")


def test_check_failure_logs_the_diff() -> None:
    """A CHECK that finds the rules gone: one error line, the diff in its details field."""
    node = Node()
    node.run("ADD")
    node.firewall.tables.clear()
    node.log.seek(0)
    node.log.truncate()
    assert node.run("CHECK").exit_code == 1
    (line,) = errors(node.logs)
    assert "differ from the expected ones" in line["msg"]
    assert "PROXY_INIT_REDIRECT" in line["details"]


def test_environment_failure_is_logged() -> None:
    """Even a missing CNI_COMMAND (no config read yet) is one error line."""
    node = Node()
    result = node.run("ADD", env={"CNI_PATH": "/opt/cni/bin"})
    assert result.exit_code == 1
    (line,) = errors(node.logs)
    assert line["msg"] == (
        "linkerd-cni: (no CNI_COMMAND) failed: required env variables [CNI_COMMAND] missing"
    )


def test_success_at_warn_level_logs_nothing() -> None:
    """upstream's default level: a good ADD is silent."""
    node = Node()
    assert node.run("ADD", plain_config()).exit_code == 0
    assert node.logs == ""


def test_debug_shows_config_and_prev_result_with_secrets_redacted() -> None:
    """At debug: the config (stdin) and upstream's "config parsed" line with version and
    prevResult; token-like values never reach the log."""
    node = Node()
    stdin = plain_config(
        log_level="debug",
        kubernetes={"kubeconfig": KUBECONFIG, "token": "s3cr3t-token"},
        auth={"password": "hunter2", "kubeconfig": "apiVersion: v1\nusers: []\n"},
    )
    assert node.run("ADD", stdin).exit_code == 0
    assert "s3cr3t" not in node.logs
    assert "hunter2" not in node.logs
    assert "users: []" not in node.logs
    by_msg = {r["msg"].split(":")[0] + ":" + r["msg"].split(":")[1]: r for r in records(node.logs)}
    stdin_line = by_msg["linkerd-cni: stdin to plugin"]["msg"]
    logged = json.loads(stdin_line.removeprefix("linkerd-cni: stdin to plugin: "))
    assert logged["kubernetes"] == {"kubeconfig": KUBECONFIG, "token": logs.REDACTED}
    assert logged["auth"] == {"password": logs.REDACTED, "kubeconfig": logs.REDACTED}
    parsed = by_msg["linkerd-cni: cmdAdd, config parsed"]
    assert parsed["version"] == "1.0.0"
    assert json.loads(parsed["prevResult"]) == PREV


def test_internal_error_logs_traceback_at_debug_only() -> None:
    """A bug is CNI error 999 and one error line; its traceback is a debug line."""

    class Broken:
        def connect(self, kubeconfig: str, env: object) -> object:
            raise RuntimeError("boom")

    from multicall.plugin.ports import PluginDeps
    from multicall.plugin.run import PluginRequest, run_plugin

    for level, traceback in (("", False), ("debug", True)):
        log = io.BytesIO()
        request = PluginRequest(env("ADD"), plain_config(log_level=level), log)
        result = run_plugin(request, PluginDeps(Broken(), None))  # type: ignore[arg-type]
        assert json.loads(result.stdout)["msg"] == "RuntimeError: boom"
        text = log.getvalue().decode()
        assert len(errors(text)) == 1
        assert ("Traceback (most recent call last)" in text) is traceback


# ----------------------------------------------------------------------------- log_file


def test_log_file_receives_the_lines(tmp_path: Path) -> None:
    """`log_file`: the same lines as stderr, in a 0600 file."""
    path = tmp_path / "linkerd-cni.log"
    node = Node()
    node.kube.failure = "Unauthorized"
    assert node.run("ADD", plain_config(log_file=str(path))).exit_code == 1
    assert path.read_text() == node.logs
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    node.kube.failure = None
    assert node.run("ADD", plain_config(log_file=str(path), log_level="info")).exit_code == 0
    assert path.read_text() == node.logs  # appended, by a second invocation


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("relative", "not an absolute path"),
        ("dotdot", "not a normalized path"),
        ("conf", "named like a CNI config"),
        ("symlink", "not a regular file"),
        ("fifo", "not a regular file"),
        ("nodir", "No such file or directory"),
    ],
)
def test_a_bad_log_file_never_fails_add(tmp_path: Path, name: str, problem: str) -> None:
    """A log file that cannot be used: ADD succeeds, one warning on stderr, nothing written
    through a symlink or into a FIFO."""
    target = tmp_path / "elsewhere"
    paths = {
        "relative": "var/log/linkerd-cni.log",
        "dotdot": f"{tmp_path}/../linkerd-cni.log",
        "conf": f"{tmp_path}/99-linkerd.conflist",
        "symlink": f"{tmp_path}/link.log",
        "fifo": f"{tmp_path}/fifo.log",
        "nodir": f"{tmp_path}/missing/linkerd-cni.log",
    }
    os.symlink(target, tmp_path / "link.log")
    os.mkfifo(tmp_path / "fifo.log")
    node = Node()
    assert node.run("ADD", plain_config(log_file=paths[name])).exit_code == 0
    (line,) = records(node.logs)
    assert line["level"] == "warning"
    assert line["msg"].startswith(f"log file not used: {paths[name]}: ")
    assert problem in line["msg"]
    assert not target.exists()


def test_a_failing_write_is_reported_once_and_add_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log file that fails on write (disk full): one warning, the command goes on."""
    import errno

    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    node = Node()
    stdin = plain_config(log_file=str(tmp_path / "cni.log"), log_level="debug")
    assert node.run("ADD", stdin).exit_code == 0
    warnings = [r for r in records(node.logs) if r["level"] == "warning"]
    assert [w["msg"] for w in warnings] == [
        f"log file not written any more: {tmp_path}/cni.log: No space left on device"
    ]


def test_rotation_bounds_the_file(tmp_path: Path) -> None:
    """Past its bound the file moves to PATH.1 (replacing the older one): never more than
    about twice the bound on disk, the newest lines always in PATH."""
    path = tmp_path / "cni.log"
    log = Logger(None, "info", clock=lambda: 0.0)
    log.open_file(str(path), max_bytes=1000)
    for i in range(200):
        log.info(f"line {i:03d}")
    log.close()
    assert path.stat().st_size <= 1000
    assert Path(f"{path}.1").stat().st_size <= 1000
    assert not Path(f"{path}.2").exists()
    assert parse_line(path.read_text().splitlines()[-1])["msg"] == "line 199"
    older = [parse_line(x)["msg"] for x in Path(f"{path}.1").read_text().splitlines()]
    newer = [parse_line(x)["msg"] for x in path.read_text().splitlines()]
    assert older + newer == [f"line {i:03d}" for i in range(200 - len(older) - len(newer), 200)]


def test_two_writers_share_a_rotating_file(tmp_path: Path) -> None:
    """Two plugin processes appending (two open files here): after one rotates, the other
    follows the path to the new file; no line is lost from the two files."""
    path = tmp_path / "cni.log"
    a, b = LogFile(str(path), 600), LogFile(str(path), 600)
    assert a.open()
    assert b.open()
    lines = [f"{'ab'[i % 2]} {i:03d} {'x' * 20}\n".encode() for i in range(40)]
    for i, line in enumerate(lines):
        assert (a if i % 2 == 0 else b).write(line)
    a.close()
    b.close()
    kept = (Path(f"{path}.1").read_bytes() + path.read_bytes()).splitlines(keepends=True)
    assert kept == lines[len(lines) - len(kept) :]
    assert path.stat().st_size <= 600


def test_logfmt_matches_logrus() -> None:
    """logrus's quoting: bare for [A-Za-z0-9-._/@^+] and empty, %q otherwise (non-ASCII too);
    fields sorted after time, level, msg; JSON sorted and HTML-safe."""
    line = logs.format_line(
        "plain", "2025-01-02T03:04:05Z", "info", "a b", {"Pod": "", "B": "é", "A": "x/y"}
    )
    assert line == 'time="2025-01-02T03:04:05Z" level=info msg="a b" A=x/y B="é" Pod=\n'
    as_json = logs.format_line("json", "T", "error", "<x>", {"msg": "m", "Pod": "p"})
    assert (
        as_json
        == '{"Pod":"p","fields.msg":"m","level":"error","msg":"\\u003cx\\u003e","time":"T"}\n'
    )
