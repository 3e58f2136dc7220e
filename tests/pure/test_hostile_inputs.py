"""Hostile inputs to the plugin, iptables-verify and netns-exec, at the command level (the
source tree, or the built binary under CNIBOX=...): each is refused with a clear message
naming the input, fast, in bounded memory, with no Python internals in the output.
tests/hostile_inputs.md lists every case and its expected outcome (classes 2, 3a, 8).

No root and no network are needed: the kubeconfig, token and namespace cases fail before
any connection or setns. Cost: about 25 s (a 100 MB config, a 50 MB save, ~30 commands).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from multicall.core.limits import KUBECONFIG, MIB, NETWORK_CONFIG, OBJECT_FILE, TOKEN_FILE
from multicall.effects.ns import NetnsRef
from multicall.plugin.ports import PluginDeps, RealFirewall
from multicall.plugin.run import PluginRequest, run_plugin
from tests.support import cnibox_argv
from tests.support.fakes import FakeKube, MemoryFirewall
from tests.support.hostile import (
    RSS_BOUND,
    Measured,
    cni_env,
    run_measured,
    write_big_config,
    write_big_save,
    write_plugin_config,
)
from tests.support.plain import assert_plain
from tests.support.pods import MESHED
from tests.support.scenarios import netconf

FAST = 10.0  # seconds: "fails fast" (these take well under a second; the bound is CI-proof)


def plain(text: str) -> str:
    assert_plain(text)  # no Python internals (tests/support/plain.py)
    return text


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.fixture
def big_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = write_big_config(tmp_path_factory.mktemp("big") / "conf.json", 100 * MIB)
    yield path
    path.unlink()


# ----------------------------------------------------------------------------- linkerd-cni


def write_config(tmp_path: Path, **kubernetes: str) -> Path:
    return write_plugin_config(tmp_path / "conf.json", **kubernetes)


def cni_error(result: Measured) -> dict[str, object]:
    assert result.returncode == 1, result.out + result.err
    error: dict[str, object] = json.loads(result.stdout)
    plain(str(error["msg"]))
    return error


def run_cni(stdin: str | Path, **env: str) -> Measured:
    return run_measured(cnibox_argv("linkerd-cni"), stdin=stdin, env=cni_env(**env))


class TestPluginInputs:
    def test_100mb_config_is_refused_in_bounded_memory(self, big_config: Path) -> None:
        """A valid 100 MB config on stdin: CNI error 5 naming the 1 MiB limit, having read
        1 MiB of it (the issue saw 520 MB RSS for 27 s)."""
        result = run_cni(big_config)
        error = cni_error(result)
        assert error["code"] == 5
        assert error["msg"] == (
            "error reading from stdin: the network config is larger than 1 MiB, the limit for it"
        )
        assert result.peak_rss < RSS_BOUND
        assert result.seconds < FAST

    def test_endless_stdin(self) -> None:
        """/dev/zero as stdin: the same refusal, not an endless read."""
        result = run_cni("/dev/zero")
        assert cni_error(result)["code"] == 5
        assert result.peak_rss < RSS_BOUND

    @pytest.mark.parametrize(
        ("depth", "code", "message"),
        [
            (5000, 0, ""),  # Go accepts nesting up to 10000; so does cnibox, without recursion
            (
                10001,
                6,
                "error unmarshall network config: invalid character '[' exceeded max depth",
            ),
        ],
    )
    def test_deeply_nested_config(
        self, tmp_path: Path, depth: int, code: int, message: str
    ) -> None:
        """Deep JSON: Go's verdict, never a RecursionError (the issue's class 8)."""
        path = tmp_path / "deep.json"
        pad = "[" * (depth - 1) + "]" * (depth - 1)
        path.write_text(f'{{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni","x":{pad}}}')
        result = run_cni(path, CNI_ARGS="")
        if code == 0:
            assert result.returncode == 0, result.out
            assert json.loads(result.stdout) == {"cniVersion": "1.0.0"}
        else:
            assert cni_error(result) == {"code": code, "msg": message}

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            ("/dev/zero", "kubeconfig /dev/zero is a character device, not a regular file"),
            ("fifo", "kubeconfig {path} is a FIFO, not a regular file"),
            ("dir", "kubeconfig {path} is a directory, not a regular file"),
            ("big", "kubeconfig {path} is larger than 4 MiB, the limit for it"),
            ("utf8", 'error loading config file "{path}": yaml: invalid leading UTF-8 octet'),
            ("deep", 'error loading config file "{path}": while increasing flow level'),
            ("crlf-token", "users[].user.token contains a carriage return (CR)"),
            ("crlf-server", "clusters[].cluster.server"),
            ("ca-fifo", "certificate-authority file {fifo} is a FIFO, not a regular file"),
            ("ca-zero", "certificate-authority file /dev/zero is a character device"),
            ("ca-junk", "unable to load root certificates: unable to parse bytes as PEM block"),
        ],
    )
    def test_kubeconfig(self, tmp_path: Path, fifo: Path, content: str, message: str) -> None:
        """The kubeconfig the config names, and the files it names: refused fast, naming
        them (no API is contacted)."""
        path = tmp_path / "kubeconfig"
        if content == "/dev/zero":
            path = Path("/dev/zero")
        elif content == "fifo":
            path = fifo
        elif content == "dir":
            path = tmp_path
        elif content == "big":
            path.write_bytes(b"#" * (KUBECONFIG + 1))
        elif content == "utf8":
            path.write_bytes(b"kind: \xff")
        elif content == "deep":
            path.write_text("a: " + "[" * 5000 + "]" * 5000)
        else:
            server = "https://h/api\r\nX-Injected: 1" if content == "crlf-server" else "https://h"
            token = "abc\r\nX-Injected: 1" if content == "crlf-token" else "abc"
            cluster = {"server": server}
            if content.startswith("ca-"):
                junk = tmp_path / "junk.pem"
                junk.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n")
                ca = {"ca-fifo": fifo, "ca-zero": "/dev/zero"}.get(content, junk)
                cluster["certificate-authority"] = str(ca)
            path.write_text(
                json.dumps(
                    {
                        "clusters": [{"name": "c", "cluster": cluster}],
                        "users": [{"name": "u", "user": {"token": token}}],
                        "contexts": [
                            {
                                "name": "linkerd-cni-context",
                                "context": {"cluster": "c", "user": "u"},
                            }
                        ],
                    }
                )
            )
        result = run_cni(write_config(tmp_path, kubeconfig=str(path)))
        error = cni_error(result)
        assert message.format(path=path, fifo=fifo) in str(error["msg"])
        assert result.seconds < FAST
        assert result.peak_rss < RSS_BOUND

    @pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "big"])
    def test_token_file(self, tmp_path: Path, fifo: Path, kind: str) -> None:
        """users[].user.tokenFile: a regular file of at most 64 KiB."""
        token = {"fifo": fifo, "/dev/zero": Path("/dev/zero")}.get(kind, tmp_path / "token")
        if kind == "big":
            token.write_bytes(b"a" * (TOKEN_FILE + 1))
        kubeconfig = tmp_path / "kc"
        kubeconfig.write_text(
            "clusters: [{name: c, cluster: {server: 'https://h'}}]\n"
            f"users: [{{name: u, user: {{tokenFile: '{token}'}}}}]\n"
            "contexts: [{name: linkerd-cni-context, context: {cluster: c, user: u}}]\n"
        )
        result = run_cni(write_config(tmp_path, kubeconfig=str(kubeconfig)))
        message = str(cni_error(result)["msg"])
        assert message.startswith(f"token file {token} ")
        assert ("64 KiB" in message) == (kind == "big")
        assert result.seconds < FAST

    @pytest.mark.parametrize(
        ("value", "code"), [("inf", None), ("1e308", None), ("nan", 4), ("-1", 4), ("x", 4)]
    )
    def test_kube_timeout_values(self, tmp_path: Path, value: str, code: int | None) -> None:
        """CNIBOX_KUBE_TIMEOUT: clamped (inf, huge) or refused (CNI code 4); never an
        OverflowError. A missing kubeconfig shows the clamped ones got past it."""
        config = write_config(tmp_path, kubeconfig=str(tmp_path / "absent"))
        error = cni_error(run_cni(config, CNIBOX_KUBE_TIMEOUT=value))
        if code is None:
            assert error["msg"] == f"stat {tmp_path}/absent: no such file or directory"
        else:
            assert error["code"] == code
            assert str(error["msg"]).startswith(f"CNIBOX_KUBE_TIMEOUT='{value}' is not a number")


# ----------------------------------------------------------------------------- iptables-verify


def run_verify(*args: str, stdin: str | Path | None = None) -> Measured:
    return run_measured([*cnibox_argv("iptables-verify"), *args], stdin=stdin)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "netconf.json"
    path.write_text(json.dumps(netconf("default-legacy")))
    return path


class TestVerifyInputs:
    def test_50mb_save_in_bounded_memory(self, tmp_path: Path, config: Path) -> None:
        """A kube-proxy-sized 50 MB save is verified streaming: exit 0, peak RSS bounded
        (the issue saw 894 MB)."""
        save = write_big_save(tmp_path / "big.save", 50 * MIB)
        result = run_verify("--config", str(config), "--input", str(save), "--quiet")
        assert result.returncode == 0, result.err
        assert result.peak_rss < RSS_BOUND
        assert save.stat().st_size > 50_000_000 > result.peak_rss

    @pytest.mark.parametrize(
        "case",
        [
            ("--input", "/dev/zero", "--input /dev/zero is a character device, not a regular file"),
            ("--input", "fifo", "--input {fifo} is a FIFO, not a regular file"),
            ("--input", "dir", "--input {dir} is a directory, not a regular file"),
            ("--config", "fifo", "--config {fifo} is a FIFO, not a regular file"),
            ("--config", "/dev/zero", "--config /dev/zero is a character device"),
            ("--pod", "fifo", "--pod {fifo} is a FIFO, not a regular file"),
            ("--service", "dir", "--service {dir} is a directory, not a regular file"),
            ("--netns", "fifo", "{fifo} is a FIFO, not a network namespace"),
            ("--netns", "dir", "{dir} is a directory, not a network namespace"),
            ("--netns", "/dev/null", "/dev/null is a character device, not a network namespace"),
            ("--netns", "file", "{file} is a regular file, not a network namespace"),
            ("--netns", "/proc/self/ns/mnt", "/proc/self/ns/mnt is a mount namespace, not a"),
            ("--kubeconfig", "fifo", "kubeconfig {fifo} is a FIFO, not a regular file"),
        ],
    )
    def test_paths_fail_fast(
        self, tmp_path: Path, fifo: Path, config: Path, case: tuple[str, str, str]
    ) -> None:
        """FIFOs, devices, directories and other namespaces as any path: exit 2 at once."""
        option, target, message = case
        regular = tmp_path / "regular"
        regular.write_text("x")
        paths = {"fifo": str(fifo), "dir": str(tmp_path), "file": str(regular)}
        value = paths.get(target, target)
        args = ["--config", str(config), option, value]
        if option in ("--config", "--pod", "--service", "--kubeconfig"):
            args = [*(["--config", str(config)] if option != "--config" else []), option, value]
            args += ["--input", "-"]
            if option == "--kubeconfig":
                args += ["--namespace", "ns", "--pod", "p"]
            elif option == "--service":
                args += ["--pod", str(regular)]
        result = run_verify(*args)
        assert result.returncode == 2, result.out + result.err
        expected = message.format(fifo=fifo, dir=tmp_path, file=regular)
        assert plain(result.err).startswith(f"iptables-verify: {expected}")
        assert result.seconds < FAST

    def test_oversized_files(self, tmp_path: Path, config: Path, big_config: Path) -> None:
        """--config and object files: at most 4 MiB each."""
        result = run_verify("--config", str(big_config), "--input", "-")
        assert result.returncode == 2
        assert plain(result.err) == (
            f"iptables-verify: --config {big_config} is larger than 4 MiB, the limit for it "
            "(docs/hardening.md)\n"
        )
        assert result.peak_rss < RSS_BOUND
        pod = tmp_path / "pod.json"
        pod.write_bytes(b" " * (OBJECT_FILE + 1))
        result = run_verify("--config", str(config), "--pod", str(pod), "--input", "-")
        assert "--pod " in plain(result.err)
        assert "larger than 4 MiB" in result.err

    def test_endless_input_line(self, config: Path) -> None:
        """--input - fed /dev/zero: one line over 64 KiB is refused, not buffered forever."""
        result = run_verify("--config", str(config), "--input", "-", stdin="/dev/zero")
        assert result.returncode == 2
        assert plain(result.err) == (
            "iptables-verify: --input - (standard input): line 1 is longer than 64 KiB, "
            "the limit for a line (docs/hardening.md)\n"
        )
        assert result.peak_rss < RSS_BOUND

    def test_deep_yaml_and_json_objects(self, tmp_path: Path, config: Path) -> None:
        """Deeply nested pod files (JSON and YAML): a plain message, no RecursionError."""
        for text in ("[" * 100000, "a: " + "[" * 5000 + "]" * 5000, "- " * 3000 + "x"):
            pod = tmp_path / "pod"
            pod.write_text(text)
            result = run_verify("--config", str(config), "--pod", str(pod), "--input", "-")
            assert result.returncode == 2
            assert plain(result.err).startswith(f"iptables-verify: {pod}: ")


# ----------------------------------------------------------------------------- netns-exec


def test_netns_exec_fifo_fails_fast(fifo: Path) -> None:
    """nsenter --net=FIFO: util-linux waits forever in open(); netns-exec opens it
    non-blocking and reports setns's refusal in util-linux's words."""
    result = run_measured([*cnibox_argv("nsenter"), f"--net={fifo}", "true"])
    assert result.returncode == 1
    assert result.err == "nsenter: reassociate to namespace 'ns/net' failed: Invalid argument\n"
    assert result.seconds < FAST


def test_limits_are_documented() -> None:
    """Every limit these tests hit is in docs/hardening.md's table, with its value."""
    from tests.support import REPO

    doc = (REPO / "docs" / "hardening.md").read_text()
    for name, size in (
        ("NETWORK_CONFIG", NETWORK_CONFIG),
        ("KUBECONFIG", KUBECONFIG),
        ("TOKEN_FILE", TOKEN_FILE),
        ("OBJECT_FILE", OBJECT_FILE),
    ):
        from multicall.core.limits import describe_size

        assert f"`{name}`" in doc, name
        assert describe_size(size) in doc, name


# ----------------------------------------------------------------------------- CNI_NETNS


class TestPluginNetns:
    """CNI_NETNS through the seam with the real firewall adapter: every bad path fails
    before any setns, so no root is needed (tests/netns has the root cases)."""

    @staticmethod
    def add(netns: str, firewall: Any = None, **env: str) -> tuple[int, dict[str, Any], float]:
        kube = FakeKube()
        kube.add_pod(MESHED)
        meta = MESHED["metadata"]
        request = PluginRequest(
            env={
                **cni_env(CNI_NETNS=netns, **env),
                "CNI_ARGS": f"K8S_POD_NAMESPACE={meta['namespace']};K8S_POD_NAME={meta['name']}",
            },
            stdin=json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "k8s-pod-network",
                    "type": "linkerd-cni",
                    "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
                }
            ).encode(),
            stderr=io.BytesIO(),
        )
        started = time.monotonic()
        result = run_plugin(request, PluginDeps(kube, firewall or RealFirewall()))
        seconds = time.monotonic() - started
        return result.exit_code, json.loads(result.stdout), seconds

    @pytest.mark.parametrize(
        ("target", "what"),
        [
            ("fifo", "a FIFO"),
            ("dir", "a directory"),
            ("/dev/null", "a character device"),
            ("file", "a regular file"),
            ("/proc/self/ns/mnt", "a mount namespace"),
        ],
    )
    def test_not_a_network_namespace(
        self, tmp_path: Path, fifo: Path, target: str, what: str
    ) -> None:
        """A FIFO blocked ADD forever in open(); now every non-namespace is CNI error 8
        naming what it is, at once."""
        regular = tmp_path / "file"
        regular.write_text("")
        path = {"fifo": str(fifo), "dir": str(tmp_path), "file": str(regular)}.get(target, target)
        rc, error, seconds = self.add(path)
        assert (rc, error["code"]) == (1, 8)
        assert error["msg"] == f"{path} is {what}, not a network namespace"
        assert seconds < FAST

    def test_the_opened_fd_is_what_is_checked_and_entered(self) -> None:
        """CNI_NETNS is opened once; the own-netns refusal and the firewall use that fd, so
        a path swapped between the two cannot slip through (no stat-then-open)."""
        seen: list[NetnsRef] = []

        class Recorder(MemoryFirewall):
            def apply(self, netns: NetnsRef, *args: Any, **kw: Any) -> None:
                seen.append(netns)

        rc, error, _ = self.add("/proc/self/ns/net", Recorder())
        assert (rc, error["code"]) == (1, 8)  # the caller's own netns, refused by fd
        assert error["msg"] == "plugin's netns and netns from CNI_NETNS should not be the same"
        assert seen == []
        rc, _, _ = self.add("/proc/self/ns/net", Recorder(), CNI_NETNS_OVERRIDE="1")
        assert rc == 0
        assert seen[0].fd is not None
        assert seen[0].path == "/proc/self/ns/net"


@pytest.mark.parametrize("closed", ["<&-", ">&-", "2>&-"])
def test_closed_standard_streams(closed: str) -> None:
    """A runtime that starts the plugin with a standard stream closed: the stream reads as
    empty or writes to nowhere, never a traceback (Python leaves it None)."""
    proc = subprocess.run(
        ["sh", "-c", f'exec "$@" {closed}', "sh", *cnibox_argv("linkerd-cni")],
        env=cni_env(CNI_ARGS=""),
        input=None if closed == "<&-" else b'{"cniVersion":"1.0.0","name":"n","type":"x"}',
        capture_output=True,
        timeout=60,
        check=False,
    )
    plain(proc.stderr.decode())
    if closed == "<&-":  # an empty config: skel's decoding error
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["msg"] == (
            "error unmarshall network config: unexpected end of JSON input"
        )
    elif closed == ">&-":
        assert (proc.returncode, proc.stdout) == (0, b"")
    else:
        assert proc.returncode == 0
        assert json.loads(proc.stdout) == {"cniVersion": "1.0.0"}


def test_every_row_names_an_existing_test() -> None:
    """tests/hostile_inputs.md: each `file::Class::test` names a test that exists, and so
    does each `…::test` in one of its section's files (class optional), so the matrix cannot
    silently go stale."""
    import ast

    from tests.support import REPO

    text = (REPO / "tests" / "hostile_inputs.md").read_text()
    missing = []
    for section in re.split(r"(?m)^## ", text)[1:]:
        refs = re.findall(r"`((?:[\w/]+\.py|…)(?:::[A-Za-z_]\w*)+)", section)
        files = {ref.split("::")[0] for ref in refs} - {"…"}
        modules = {}
        for name in files:
            path = REPO / "tests" / name
            modules[name] = ast.parse(path.read_text()).body if path.is_file() else []
        for ref in refs:
            head, *names = ref.split("::")
            scopes = [modules[head]] if head != "…" else list(modules.values())
            if head == "…":  # the class may be left out
                scopes += [
                    n.body for m in modules.values() for n in m if isinstance(n, ast.ClassDef)
                ]
            if not any(_defines(scope, names) for scope in scopes):
                missing.append(ref)
    assert missing == []


def _defines(scope: list[Any], names: list[str]) -> bool:
    import ast

    for name in names:
        found = next(
            (n for n in scope if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name),
            None,
        )
        if found is None:
            return False
        scope = found.body
    return True
