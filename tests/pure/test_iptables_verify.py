"""iptables-verify as a command: expected rules from the plugin's inputs, exit 0 on a match,
1 with a diff naming the rule on any mismatch, 2 for usage and input errors."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multicall.applets import iptables_verify
from multicall.core import usage
from multicall.core.firewall.diff import diff_tables
from multicall.core.firewall.iptables_save import parse_save
from multicall.core.firewall.proxy_init import expected_table
from multicall.core.firewall.report import format_diff
from multicall.core.firewall.ruleset import render_rule
from multicall.errors import UsageError
from tests.support import FIXTURES, cnibox_argv
from tests.support.cnibox import run_applet_inproc
from tests.support.plain import assert_plain
from tests.support.rulesets import last_table
from tests.support.scenarios import OK_NAMES, netconf, scenario_family, scenario_options

LINKERD = FIXTURES / "derived/linkerd-iptables"
CANON = FIXTURES / "derived/iptables-canonicalization"


def write_json(tmp_path: Path, name: str, doc: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def run_inproc(args: Sequence[str], stdin: bytes = b"") -> tuple[int, str, str]:
    """The applet through the dispatcher's boundary, in this process (exit-code mapping)."""
    return run_applet_inproc("iptables-verify", args, stdin)


def run_cmd(args: Sequence[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cnibox_argv("iptables-verify"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class TestScenarios:
    @pytest.mark.parametrize("name", OK_NAMES)
    def test_expected_table_matches_fixture(self, name: str) -> None:
        """ProxyInitOptions from scenario.json give exactly the fixture's nat table."""
        text = (LINKERD / f"{name}.iptables-save.txt").read_text()
        actual = last_table(parse_save(text), "nat")
        assert actual is not None
        want = expected_table(scenario_options(name), scenario_family(name))
        for strict in (False, True):
            diff = diff_tables(want, actual, strict=strict)
            assert diff.ok, format_diff(diff)

    @pytest.mark.parametrize("name", OK_NAMES)
    def test_command_exits_0(self, name: str, tmp_path: Path) -> None:
        """The command with the scenario as config verifies the fixture (exit 0)."""
        config = write_json(tmp_path, "conf.json", netconf(name))
        family = scenario_family(name).value
        save = str(LINKERD / f"{name}.iptables-save.txt")
        proc = run_cmd(["--config", config, "--input", save, "--family", family, "--strict"])
        assert proc.returncode == 0, proc.stdout + proc.stderr
        table = last_table(parse_save(Path(save).read_text()), "nat")
        assert table is not None
        assert (
            proc.stdout == f"{family} nat table of {save}: OK ({len(table.rules)} rules compared)\n"
        )

    def test_control_plane_pod_adds_api_server_ports(self, tmp_path: Path) -> None:
        """A control-plane pod without --service expects the fallback 443,6443 skip rule."""
        config = netconf("control-plane-nft", **{"outbound-ports-to-ignore": []})
        pod = {
            "kind": "Pod",
            "metadata": {
                "name": "linkerd-destination-1",
                "namespace": "linkerd",
                "labels": {"linkerd.io/control-plane-component": "destination"},
            },
            "spec": {"containers": [{"name": "linkerd-proxy"}, {"name": "destination"}]},
        }
        save = str(LINKERD / "control-plane-nft.iptables-save.txt")
        args = ["--config", write_json(tmp_path, "c.json", config), "--input", save]
        rc, out, _ = run_inproc([*args, "--pod", write_json(tmp_path, "pod.json", pod)])
        assert rc == 0, out
        rc, out, _ = run_inproc(args)
        assert rc == 1
        assert 'ignore-port-443,6443" -j RETURN    # unexpected' in out


def _mutations(name: str) -> list[tuple[str, str, str]]:
    """(label, mutated save text, rule text the report must name) per PROXY_INIT rule."""
    lines = (LINKERD / f"{name}.iptables-save.txt").read_text().split("\n")
    out = []
    last_dump = max(i for i, line in enumerate(lines) if line == "*nat")  # what is compared
    for i, line in enumerate(lines):
        if i < last_dump or not (line.startswith("-A") and "PROXY_INIT_" in line):
            continue
        out.append(("remove", [*lines[:i], *lines[i + 1 :]], line))
        out.append(("duplicate", [*lines[: i + 1], line, *lines[i + 1 :]], line))
        altered = line.replace("proxy-init/", "proxy-init/x")
        out.append(("alter", [*lines[:i], altered, *lines[i + 1 :]], line))
        chain = line.split()[1]
        if lines[i + 1].startswith(f"-A {chain} "):
            swapped = [*lines[:i], lines[i + 1], line, *lines[i + 2 :]]
            out.append(("reorder", swapped, line))
    return [(label, "\n".join(text), rule) for label, text, rule in out]


class TestMutations:
    @pytest.mark.parametrize("name", OK_NAMES)
    def test_any_single_change_exits_1_naming_the_rule(self, name: str, tmp_path: Path) -> None:
        """Removing, duplicating, altering or reordering a PROXY_INIT rule: exit 1, named.
        But a jump from PREROUTING/OUTPUT with another comment is one ADD keeps (it adds
        none when a jump matches upstream's regex): exit 0, as CHECK after that ADD."""
        config = write_json(tmp_path, "conf.json", netconf(name))
        family = scenario_family(name).value
        cases = _mutations(name)
        assert len(cases) >= 3 * 7
        for label, text, rule in cases:
            rc, out, err = run_inproc(
                ["--config", config, "--input", "-", "--family", family], text.encode()
            )
            if label == "alter" and rule.startswith(("-A PREROUTING ", "-A OUTPUT ")):
                assert rc == 0, (label, rule, out, err)
                continue
            assert rc == 1, (label, rule, out, err)
            if label == "reorder":
                assert "# moved" in out, (label, out)
            else:
                assert rule in out, (label, rule, out)

    def test_through_the_command(self, tmp_path: Path) -> None:
        """The same through cnibox itself, for every change to default-nft."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        for label, text, rule in _mutations("default-nft"):
            proc = run_cmd(["--config", config, "--input", "-"], text)
            kept_jump = label == "alter" and rule.startswith(("-A PREROUTING ", "-A OUTPUT "))
            assert proc.returncode == (0 if kept_jump else 1), (label, proc.stdout, proc.stderr)
            if kept_jump:
                continue
            assert rule in proc.stdout or label == "reorder", (label, proc.stdout)


class TestReports:
    def test_json_output_is_valid(self, tmp_path: Path) -> None:
        """--json prints one JSON document with the documented fields, on match and not."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        good = str(LINKERD / "default-nft.iptables-save.txt")
        proc = run_cmd(["--config", config, "--input", good, "--json"])
        doc = json.loads(proc.stdout)
        assert proc.returncode == 0
        assert doc["schema"] == "cnibox.iptables-verify/v1"
        assert (doc["match"], doc["family"], doc["source"]) == (True, "ipv4", good)
        assert set(doc) >= {"table", "scope", "compared_rules", "chains", "rules", "pod"}
        twice = str(CANON / "save-after-two-restores.nft.txt")
        proc = run_cmd(["--config", config, "--input", twice, "--json"])
        doc = json.loads(proc.stdout)
        assert proc.returncode == 1
        assert doc["match"] is False
        assert {r["problem"] for r in doc["rules"]} == {"missing", "unexpected"}
        assert all(isinstance(r["line"], int) for r in doc["rules"] if r["problem"] == "unexpected")

    def test_nft_warning_lines_become_notes(self, tmp_path: Path) -> None:
        """iptables-nft-save's legacy-tables warning is passed on (text note, JSON list)."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        warning = "# Warning: iptables-legacy tables present, use iptables-legacy-save to see them"
        text = (LINKERD / "default-nft.iptables-save.txt").read_text() + warning + "\n"
        rc, out, _ = run_inproc(["--config", config, "--input", "-"], text.encode())
        assert rc == 0
        assert out.startswith("note: Warning: iptables-legacy tables present")
        rc, out, _ = run_inproc(["--config", config, "--input", "-", "--json"], text.encode())
        assert json.loads(out)["warnings"] == [warning]

    def test_quiet_prints_nothing(self, tmp_path: Path) -> None:
        """--quiet: only the exit status speaks."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        twice = str(CANON / "save-after-two-restores.nft.txt")
        rc, out, err = run_inproc(["--config", config, "--input", twice, "--quiet", "--json"])
        assert (rc, out, err) == (1, "", "")

    def test_conflist_entry_is_used(self) -> None:
        """A conflist with a linkerd-cni entry (as the installer writes it) is accepted."""
        conflist = FIXTURES / "derived/linkerd-go-installer/from-10-calico.conflist.result.conflist"
        save = LINKERD / "default-legacy.iptables-save.txt"
        rc, out, err = run_inproc(["--config", str(conflist), "--input", str(save)])
        assert rc == 0, out + err


class TestPods:
    POD: ClassVar[dict[str, object]] = {
        "kind": "Pod",
        "metadata": {"name": "web-1", "namespace": "shop"},
        "spec": {"containers": [{"name": "web"}, {"name": "linkerd-proxy"}]},
    }

    def args(self, tmp_path: Path, save: Path) -> list[str]:
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        return ["--config", config, "--input", str(save)]

    def test_unmeshed_pod_expects_no_rules(self, tmp_path: Path) -> None:
        """A pod with linkerd-init is skipped by the plugin: PROXY_INIT rules are unexpected."""
        pod = json.loads(json.dumps(self.POD))
        pod["spec"]["initContainers"] = [{"name": "linkerd-init"}]
        args = [*self.args(tmp_path, LINKERD / "default-nft.iptables-save.txt")]
        rc, out, _ = run_inproc([*args, "--pod", write_json(tmp_path, "p.json", pod)])
        assert rc == 1
        assert "note: linkerd-init initContainer is present, skipping." in out
        assert "+ :PROXY_INIT_OUTPUT -    # unexpected chain" in out

    def test_yaml_pod_and_namespace_annotations(self, tmp_path: Path) -> None:
        """Overrides come from the pod (YAML) and, where it has none, from the namespace."""
        pod = tmp_path / "pod.yaml"
        pod.write_text(
            "kind: Pod\nmetadata:\n  name: web-1\n  namespace: shop\n  annotations:\n"
            "    config.linkerd.io/proxy-gid: '2102'\n"
            "spec:\n  containers:\n  - name: linkerd-proxy\n"
        )
        ns = tmp_path / "ns.yaml"
        ns.write_text(
            "kind: Namespace\nmetadata:\n  name: shop\n  annotations:\n"
            "    config.linkerd.io/skip-outbound-ports: '443,6443,3306-3307'\n"
        )
        save = LINKERD / "full-legacy-wait.iptables-save.txt"
        config = write_json(tmp_path, "conf.json", netconf("full-legacy-wait"))
        base = ["--config", config, "--input", str(save)]
        rc, out, _ = run_inproc([*base, "--pod", str(pod), "--namespace-object", str(ns)])
        assert rc == 0, out
        rc, out, _ = run_inproc([*base, "--pod", str(pod)])
        assert rc == 0, out  # the config already lists those outbound ports
        plain = write_json(
            tmp_path, "plain.json", netconf("full-legacy-wait", **{"outbound-ports-to-ignore": []})
        )
        rc, out, _ = run_inproc(["--config", plain, "--input", str(save), "--pod", str(pod)])
        assert rc == 1
        rc, out, _ = run_inproc(
            [
                "--config",
                plain,
                "--input",
                str(save),
                "--pod",
                str(pod),
                "--namespace-object",
                str(ns),
            ]
        )
        assert rc == 0, out

    def test_simulate_expects_nothing(self, tmp_path: Path) -> None:
        """`simulate: true`: ADD programs nothing, so a fresh table verifies."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft", simulate=True))
        fresh = tmp_path / "fresh.txt"
        fresh.write_text("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n"
                         ":OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n")  # fmt: skip
        rc, out, _ = run_inproc(["--config", config, "--input", str(fresh)])
        assert rc == 0, out

    def test_a_jump_without_the_comment_is_the_one_add_kept(self, tmp_path: Path) -> None:
        """ADD keeps a PREROUTING jump matching upstream's regex instead of adding its own."""
        text = (LINKERD / "default-nft.iptables-save.txt").read_text()
        commented = next(line for line in text.splitlines() if line.startswith("-A PREROUTING"))
        save = tmp_path / "save.txt"
        save.write_text(text.replace(commented, "-A PREROUTING -j PROXY_INIT_REDIRECT"))
        rc, out, _ = run_inproc(self.args(tmp_path, save))
        assert rc == 0, out
        save.write_text(text.replace(commented + "\n", ""))
        rc, out, _ = run_inproc(self.args(tmp_path, save))
        assert rc == 1, out

    def test_ipv6_not_enabled_expects_nothing(self, tmp_path: Path) -> None:
        """--family ipv6 with `ipv6: false` in the config expects no PROXY_INIT rules."""
        args = self.args(tmp_path, LINKERD / "default-ipv6-nft.iptables-save.txt")
        rc, out, _ = run_inproc([*args, "--family", "ipv6"])
        assert rc == 1
        assert "does not enable IPv6" in out


class TestErrors:
    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ([], "--config NETCONF.json is required"),
            (["--config", "c"], "exactly one of --input, --netns or --pid"),
            (["--config", "c", "--input", "-", "--netns", "/x"], "exactly one of"),
            (["--config", "c", "--input", "-", "--family", "ipv5"], "--family must be one of"),
            (["--config", "c", "--input", "-", "--mode", "plain"], "--mode must be one of"),
            (["--config", "c", "--pid", "abc"], "is not a process id"),
            (["--config", "c", "--pid", "9" * 5000], "is not a process id"),
            (["--config", "-", "--input", "-"], "only one input can come from stdin"),
            (["--config", "c", "--input", "-", "--bogus"], "unrecognized option '--bogus'"),
            (["--config"], "option '--config' requires an argument"),
            (["--config", "c", "--input", "-", "--pod", "web-1"], "give its --namespace too"),
        ],
    )
    def test_usage_errors_exit_2(self, args: list[str], message: str) -> None:
        """Command-line mistakes exit 2 with one message and the short "Try" line."""
        rc, out, err = run_inproc(args)
        assert rc == 2
        assert err.splitlines()[0].startswith("iptables-verify: ")
        assert message in err
        assert err.splitlines()[1:] == ["Try 'iptables-verify --help' for more information."]
        assert out == ""

    def test_malformed_input_names_the_line(self, tmp_path: Path) -> None:
        """A broken save text exits 2 and names the file, line and column."""
        config = write_json(tmp_path, "conf.json", netconf("default-nft"))
        text = (LINKERD / "default-nft.iptables-save.txt").read_text()
        broken = text.replace(":PROXY_INIT_OUTPUT - [0:0]", ":PROXY_INIT_OUTPUT - [0:x]")
        proc = run_cmd(["--config", config, "--input", "-"], broken)
        assert proc.returncode == 2
        assert proc.stderr.startswith(
            "iptables-verify: <stdin>: line 7, column 1: expected counters"
        )
        assert "Traceback" not in proc.stderr

    def test_bad_inputs_exit_2(self, tmp_path: Path) -> None:
        """Missing files, bad configs and options iptables would reject all exit 2."""
        save = str(LINKERD / "default-nft.iptables-save.txt")
        rc, _, err = run_inproc(["--config", str(tmp_path / "nope.json"), "--input", save])
        assert (rc, "nope.json: No such file or directory" in err) == (2, True)
        bad = tmp_path / "bad.json"
        bad.write_text('{"type": "linkerd-cni", "linkerd": {"proxy-uid": "x"}}')
        rc, _, err = run_inproc(["--config", str(bad), "--input", save])
        assert rc == 2
        assert "failed to parse network configuration" in err
        conf = write_json(tmp_path, "c.json", netconf("error-all-outbound-ports-invalid"))
        rc, _, err = run_inproc(["--config", conf, "--input", save])
        assert rc == 2
        assert "invalid port/service `' specified" in err
        conf = write_json(tmp_path, "ok.json", netconf("default-nft"))
        rc, _, err = run_inproc(["--config", conf, "--netns", str(tmp_path / "no-such-netns")])
        assert rc == 2
        assert "no such network namespace" in err

    def test_help(self) -> None:
        """--help prints the usage text and exits 0."""
        proc = run_cmd(["--help"])
        assert proc.returncode == 0
        assert proc.stdout.startswith("usage: iptables-verify --config NETCONF.json")

    def test_usage_line_is_the_issue_s(self) -> None:
        """The documented command line is exactly the one promised in the issue."""
        assert (iptables_verify.__doc__ or "").splitlines()[0] == (
            "usage: iptables-verify --config NETCONF.json [--pod POD.json] "
            "[--namespace-object NS.json] [--service SVC.json] "
            "(--input FILE|- | --netns PATH | --pid PID) [--family ipv4|ipv6] "
            "[--mode legacy|nft] [--strict] [--json] [--quiet]"
        )


def test_render_rule_is_what_reports_print() -> None:
    """Reports print rules as iptables-save does, so users can grep their dump for them."""
    table = last_table(parse_save((LINKERD / "default-nft.iptables-save.txt").read_text()), "nat")
    assert table is not None
    text = (LINKERD / "default-nft.iptables-save.txt").read_text()
    assert all(render_rule(r) in text for r in table.rules)


_ARGS = st.lists(
    st.sampled_from(
        [
            *(o.key for o in usage.options(iptables_verify.__doc__ or "")),
            *("--strict", "--json", "--quiet", "-h", "--help", "-", "--config=x", "--pid=0"),
            *("x", "ipv4", "ipv6", "nft", "legacy", "plain", "", "=", "--", "12", "9" * 30),
        ]
    ),
    max_size=10,
)


@settings(max_examples=300, deadline=None)
@given(_ARGS)
def test_parse_args_raises_only_usage_errors(args: list[str]) -> None:
    """Any argument list parses or is a UsageError (exit 2), never anything else."""
    with contextlib.suppress(UsageError):
        opts = iptables_verify.parse_args(args)
        assert opts.config


class TestLongNumbers:
    """Issue 30 item 10: a 5,000-digit proxy-uid made `iptables-verify --pod` exit 70
    "internal error" with Python's text. Go's answer now, whatever the length."""

    def pod(self, tmp_path: Path, uid: str) -> str:
        meta = {"name": "p", "namespace": "n", "annotations": {"config.linkerd.io/proxy-uid": uid}}
        doc = {"kind": "Pod", "metadata": meta, "spec": {"containers": [{"name": "linkerd-proxy"}]}}
        return write_json(tmp_path, "pod.json", doc)

    def test_a_zero_padded_annotation_is_gos_number(self, tmp_path: Path) -> None:
        """`'0'*5000 + '2102'` is 2102 for Go's Atoi: the default scenario's rules verify."""
        config = write_json(tmp_path, "c.json", netconf("default-nft"))
        save = str(LINKERD / "default-nft.iptables-save.txt")
        args = ["--config", config, "--input", save]
        rc, out, err = run_inproc([*args, "--pod", self.pod(tmp_path, "0" * 5000 + "2102")])
        assert rc == 0, out + err
        rc, out, err = run_inproc([*args, "--pod", self.pod(tmp_path, "0" * 5000 + "2103")])
        assert rc == 1, out + err  # another uid: drift, named plainly
        assert_plain(out + err)

    @pytest.mark.parametrize("uid", ["9" * 5000, "-" + "9" * 5000, "1" * 5000 + "x"])
    def test_an_unreadable_annotation_is_refused_plainly(self, tmp_path: Path, uid: str) -> None:
        config = write_json(tmp_path, "c.json", netconf("default-nft"))
        save = str(LINKERD / "default-nft.iptables-save.txt")
        rc, out, err = run_inproc(
            ["--config", config, "--input", save, "--pod", self.pod(tmp_path, uid)]
        )
        assert rc not in (0, 70), out + err
        assert_plain(out + err)
        assert len(out + err) < 20_000

    def test_a_long_proxy_uid_in_the_config(self, tmp_path: Path) -> None:
        """A 5,000-digit `proxy-uid` number in the config: refused, the number cut short."""
        text = json.dumps(netconf("default-nft")).replace(
            '"proxy-uid": 2102', '"proxy-uid": ' + "9" * 5000
        )
        assert "9" * 5000 in text
        config = tmp_path / "c.json"
        config.write_text(text)
        save = str(LINKERD / "default-nft.iptables-save.txt")
        rc, out, err = run_inproc(["--config", str(config), "--input", save])
        assert rc not in (0, 70), out + err
        assert "out of range" in out + err
        assert len(out + err) < 1000
        assert_plain(out + err)
