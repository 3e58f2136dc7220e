"""linkerd-cni's protocol surface, byte for byte: VERSION, errors, prevResult passthrough for
every spec version, CNI_ARGS, and the skel validation order (no Kubernetes, no netns)."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from multicall.applets import find_applet, linkerd_cni
from multicall.core.cni import result as cni_result
from multicall.core.cni import skel as cni
from multicall.dispatch import run_applet
from multicall.plugin import commands
from tests.support import FIXTURES, cnibox_argv

STDOUT = FIXTURES / "derived" / "linkerd-cni-stdout"
ORACLE = FIXTURES / "derived" / "reference-plugin-oracle"
VERSIONS = cni.SUPPORTED_VERSIONS
NAME_TAG = '"json:\\"name\\""'  # how reflect prints the anonymous struct's field tag
ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "c0ffee",
    "CNI_NETNS": "/var/run/netns/no-such-pod",
    "CNI_IFNAME": "eth0",
    "CNI_PATH": "/opt/cni/bin",
}


def run(stdin: bytes | str, **env: str) -> tuple[int, bytes]:
    """The applet in-process, as libcni would run it."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    out = io.BytesIO()
    full = {k: v for k, v in {**ENV, **env}.items() if v is not None and v != "-"}
    rc = linkerd_cni.main(["linkerd-cni"], full, io.BytesIO(data), out, io.BytesIO())
    return rc, out.getvalue()


def error(code: int, msg: str, details: str = "") -> bytes:
    body: dict[str, Any] = {"code": code, "msg": msg}
    if details:
        body["details"] = details
    return json.dumps(body, indent=4).encode()


def conf(version: str | None, **extra: Any) -> str:
    body: dict[str, Any] = {"name": "k8s-pod-network", "type": "linkerd-cni", **extra}
    if version is not None:
        body = {"cniVersion": version, **body}
    return json.dumps(body)


class TestGoldens:
    """Every fixture in linkerd-cni-stdout/, in-process and through the cnibox command."""

    @pytest.mark.parametrize(
        "name",
        ["prev-031", "prev-100", "standalone-020", "standalone-031", "standalone-100",
         "standalone-empty"],
    )  # fmt: skip
    def test_add_output(self, name: str) -> None:
        """ADD without pod identity prints exactly what upstream prints."""
        rc, out = run((STDOUT / f"{name}.stdin.json").read_bytes())
        assert out == (STDOUT / f"{name}.stdout").read_bytes()
        assert rc == (1 if out.startswith(b'{\n    "code"') else 0)

    def test_version(self) -> None:
        """VERSION ignores stdin and needs only CNI_COMMAND."""
        rc, out = run(b"garbage", CNI_COMMAND="VERSION", CNI_CONTAINERID="-", CNI_PATH="-")
        assert (rc, out) == (0, (STDOUT / "VERSION.stdout").read_bytes())

    def test_error_shape(self) -> None:
        """Errors: 4-space JSON, no cniVersion, no trailing newline."""
        assert (
            cni.render_error(999, "exit status 2") == (STDOUT / "error-example.stdout").read_bytes()
        )

    @pytest.mark.parametrize("name", ["prev-031", "prev-100", "standalone-020"])
    def test_through_the_command(self, name: str) -> None:
        """The same bytes from the cnibox command (or the built binary under CNIBOX=...)."""
        proc = subprocess.run(
            cnibox_argv("linkerd-cni"),
            input=(STDOUT / f"{name}.stdin.json").read_bytes(),
            env=ENV,
            capture_output=True,
            check=False,
        )
        assert proc.stdout == (STDOUT / f"{name}.stdout").read_bytes()
        assert b"Traceback" not in proc.stderr


PREV_031 = json.loads((STDOUT / "prev-031.stdin.json").read_text())["prevResult"]
PREV_100 = json.loads((STDOUT / "prev-100.stdin.json").read_text())["prevResult"]
OUT_031 = (STDOUT / "prev-031.stdout").read_text()
OUT_100 = (STDOUT / "prev-100.stdout").read_text()
PREV_020 = {
    "cniVersion": "0.2.0",
    "ip4": {"ip": "10.42.0.7/24", "gateway": "10.42.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
    "dns": {"nameservers": ["10.43.0.10"]},
}
# types020.Result marshals cniVersion, ip4 {ip, gateway, routes}, ip6, dns (always present).
OUT_020 = """{
    "cniVersion": "VERSION",
    "ip4": {
        "ip": "10.42.0.7/24",
        "gateway": "10.42.0.1",
        "routes": [
            {
                "dst": "0.0.0.0/0"
            }
        ]
    },
    "dns": {
        "nameservers": [
            "10.43.0.10"
        ]
    }
}"""


class TestPassthroughEveryVersion:
    """prevResult is parsed with the config's version and printed back in it."""

    @pytest.mark.parametrize("version", VERSIONS)
    def test_same_family(self, version: str) -> None:
        """A prevResult of the config's own version comes back identical (relabelled)."""
        family = cni_result.family_of(version)
        prev, expected = {
            "020": (PREV_020, OUT_020.replace("VERSION", version)),
            "040": (PREV_031, OUT_031.replace('"0.3.1"', f'"{version}"')),
            "100": (PREV_100, OUT_100.replace('"1.0.0"', f'"{version}"')),
        }[family or ""]
        prev = {**prev, "cniVersion": version}
        rc, out = run(conf(version, prevResult=prev))
        assert (rc, out.decode()) == (0, expected)

    @pytest.mark.parametrize(
        ("config", "prev"),
        [("0.3.1", "1.0.0"), ("1.0.0", "0.4.0"), ("0.2.0", "0.3.1"), ("1.1.0", "0.2.0")],
    )
    def test_other_family_is_rejected(self, config: str, prev: str) -> None:
        """A prevResult from another result family fails like upstream's parseConfig."""
        supported = {"020": "[ 0.1.0 0.2.0]", "040": "[0.3.0 0.3.1 0.4.0]",
                     "100": "[1.0.0 1.1.0]"}[cni_result.family_of(config) or ""]  # fmt: skip
        rc, out = run(conf(config, prevResult={**PREV_100, "cniVersion": prev}))
        assert rc == 1
        assert out == error(
            999,
            f"linkerd-cni: could not parse prevResult: result type supports {supported} "
            f'but unmarshalled CNIVersion is "{prev}"',
        )

    def test_031_result_relabelled_within_its_family(self) -> None:
        """A 0.3.0 prevResult under a 0.4.0 config prints as 0.4.0, versions recomputed."""
        prev = {**PREV_031, "cniVersion": "0.3.0", "ips": [{**PREV_031["ips"][0], "version": "6"}]}
        rc, out = run(conf("0.4.0", prevResult=prev))
        assert (rc, out.decode()) == (0, OUT_031.replace('"0.3.1"', '"0.4.0"'))

    def test_v1_interface_fields_survive(self) -> None:
        """Interface mtu/socketPath/pciID (1.1.0 fields) pass through, keys sorted."""
        interface = {"name": "eth0", "mtu": 1450, "socketPath": "/s", "pciID": "p"}
        prev = {**PREV_100, "cniVersion": "1.1.0", "interfaces": [interface]}
        rc, out = run(conf("1.1.0", prevResult=prev))
        assert rc == 0
        assert json.loads(out)["interfaces"] == [
            {"mtu": 1450, "name": "eth0", "pciID": "p", "socketPath": "/s"}
        ]

    def test_route_extras_and_html_escaping(self) -> None:
        """Route mtu/table survive; Go escapes <, > and & in strings."""
        prev = {**PREV_031, "routes": [{"dst": "10.0.0.0/8", "mtu": 1400, "table": 0}],
                "dns": {"domain": "a<b>&c"}}  # fmt: skip
        rc, out = run(conf("0.3.1", prevResult=prev))
        assert rc == 0
        text = out.decode()
        assert '"dst": "10.0.0.0/8",\n            "mtu": 1400,\n            "table": 0' in text
        assert '"domain": "a\\u003cb\\u003e\\u0026c"' in text

    def test_addresses_are_printed_as_go_prints_them(self) -> None:
        """IPv6 is canonicalised, host bits are kept, v4-mapped becomes dotted IPv4."""
        prev = {**PREV_100, "ips": [{"address": "FD00:0:0::0001/64"},
                                    {"address": "::ffff:10.1.2.3/120"}]}  # fmt: skip
        rc, out = run(conf("1.0.0", prevResult=prev))
        assert rc == 0
        assert [ip["address"] for ip in json.loads(out)["ips"]] == ["fd00::1/64", "10.1.2.3/24"]

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("address", "10.0.0.1", "invalid CIDR address: 10.0.0.1"),
            ("address", "010.0.0.1/8", "invalid CIDR address: 010.0.0.1/8"),
            ("gateway", "10.0.0.300", "invalid IP address: 10.0.0.300"),
            ("interface", "0",
             "json: cannot unmarshal string into Go struct field Result.ips of type int"),
        ],
    )  # fmt: skip
    def test_bad_prev_result(self, field: str, value: str, message: str) -> None:
        """Malformed prevResults fail with the Go library's text."""
        prev = {**PREV_100, "ips": [{**PREV_100["ips"][0], field: value}]}
        rc, out = run(conf("1.0.0", prevResult=prev))
        assert (rc, out) == (1, error(999, f"linkerd-cni: could not parse prevResult: {message}"))


class TestSkelValidation:
    """skel v1.3.0's checks, in its order, with its codes and texts."""

    @pytest.mark.parametrize(
        ("command", "missing"),
        [
            ("ADD", "CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH"),
            ("CHECK", "CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME,CNI_PATH"),
            ("DEL", "CNI_CONTAINERID,CNI_IFNAME,CNI_PATH"),
            ("GC", "CNI_PATH"),
            ("STATUS", "CNI_PATH"),
            ("-", "CNI_COMMAND"),
        ],
    )
    def test_missing_env(self, command: str, missing: str) -> None:
        """Missing variables are listed in skel's order (the ptp oracle's format)."""
        env = dict.fromkeys(ENV, "-") | {"CNI_COMMAND": command}
        rc, out = run(conf("1.1.0"), **env)
        assert (rc, out) == (1, error(4, f"required env variables [{missing}] missing"))

    def test_matches_reference_plugin_oracle(self) -> None:
        """Missing-env and bad-JSON errors are byte-identical to Debian's ptp plugin."""
        env = dict.fromkeys(ENV, "-") | {"CNI_COMMAND": "ADD"}
        assert (
            run(conf("1.0.0"), **env)[1]
            == (ORACLE / "ptp-ADD-missing-env.stdout.json").read_bytes()
        )
        assert run(b"not json")[1] == (ORACLE / "ptp-ADD-bad-json.stdout.json").read_bytes()

    @pytest.mark.parametrize(
        ("env", "expected"),
        [
            ({"CNI_CONTAINERID": "-bad"}, error(4, "invalid characters in containerID", "-bad")),
            ({"CNI_IFNAME": "a" * 16}, error(4, "interface name is too long",
                                             "interface name should be less than 16 characters")),
            ({"CNI_IFNAME": ".."}, error(4, "interface name is . or ..")),
            ({"CNI_IFNAME": "eth 0"},
             error(4, "interface name contains / or : or whitespace characters")),
            ({"CNI_COMMAND": "FROB"}, error(4, "unknown CNI_COMMAND: FROB")),
        ],
    )  # fmt: skip
    def test_env_values(self, env: dict[str, str], expected: bytes) -> None:
        """Container ID and interface name are validated as soon as they are read."""
        assert run(conf("1.0.0"), **env) == (1, expected)

    @pytest.mark.parametrize(
        ("stdin", "expected"),
        [
            (b"", error(6, "error unmarshall network config: unexpected end of JSON input")),
            (b"[1]", error(6, "error unmarshall network config: json: cannot unmarshal array "
                              f"into Go value of type struct {{ Name string {NAME_TAG} }}")),
            (b'{"name": ""}', error(7, "missing network name")),
            (b'{"name": "a b"}', error(7, "invalid characters found in network name", "a b")),
            (b'{"name": "n", "cniVersion": "9.9.9"}',
             error(1, "incompatible CNI versions", 'config is "9.9.9", plugin supports ["0.1.0" '
                   '"0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]')),
            (b'{"name": "n", "cniVersion": 1}',
             error(6, "decoding version from network config: json: cannot unmarshal number "
                      "into Go struct field .cniVersion of type string")),
        ],
    )  # fmt: skip
    def test_config(self, stdin: bytes, expected: bytes) -> None:
        """Network config errors: decode (6), name (7), version (1)."""
        assert run(stdin) == (1, expected)

    @pytest.mark.parametrize(("command", "floor"), [("CHECK", "0.4.0"), ("GC", "1.1.0"),
                                                    ("STATUS", "1.1.0")])  # fmt: skip
    def test_version_floors(self, command: str, floor: str) -> None:
        """CHECK needs >= 0.4.0, GC and STATUS >= 1.1.0; below, code 1."""
        for version in VERSIONS:
            rc, out = run(conf(version), CNI_COMMAND=command)
            if cni.parse_version(version) < cni.parse_version(floor):
                assert (rc, out) == (1, error(1, f"config version does not allow {command}"))
            elif command == "GC":
                assert (rc, out) == (0, b"")

    def test_missing_cni_version_is_010(self) -> None:
        """No cniVersion means 0.1.0: CHECK is refused for it."""
        assert run(conf(None), CNI_COMMAND="CHECK") == (
            1,
            error(1, "config version does not allow CHECK"),
        )

    @pytest.mark.parametrize("version", VERSIONS)
    def test_del_prints_nothing(self, version: str) -> None:
        """DEL succeeds silently for every version, also for a netns that does not exist."""
        assert run(conf(version), CNI_COMMAND="DEL") == (0, b"")
        assert run(conf(version), CNI_COMMAND="DEL", CNI_NETNS="-") == (0, b"")

    def test_own_netns_is_refused_after_add(self) -> None:
        """CNI_NETNS naming the plugin's own netns: result printed, then error 8 (skel)."""
        rc, out = run(conf("1.0.0"), CNI_NETNS="/proc/self/ns/net")
        assert rc == 1
        assert out.endswith(
            error(8, "plugin's netns and netns from CNI_NETNS should not be the same")
        )
        assert run(conf("1.0.0"), CNI_NETNS="/proc/self/ns/net", CNI_NETNS_OVERRIDE="1")[0] == 0


class TestStatus:
    """STATUS (1.1.0): not ready (50) without a readable kubeconfig."""

    def test_missing_kubeconfig(self, tmp_path: Path) -> None:
        body = conf("1.1.0", kubernetes={"kubeconfig": str(tmp_path / "nope")})
        rc, out = run(body, CNI_COMMAND="STATUS")
        assert rc == 1
        doc = json.loads(out)
        assert doc["code"] == 50
        assert "no such file or directory" in doc["details"]

    def test_readable_kubeconfig(self, tmp_path: Path) -> None:
        from multicall.core.installer.config import render_kubeconfig

        path = tmp_path / "kc"
        path.write_bytes(render_kubeconfig(b"tok", b"CA", "10.0.0.1", "443"))
        body = conf("1.1.0", kubernetes={"kubeconfig": str(path)})
        assert run(body, CNI_COMMAND="STATUS") == (0, b"")


class TestCniArgs:
    """CNI_ARGS as upstream's renames + types.LoadArgs read it."""

    @pytest.mark.parametrize(
        ("args", "identity"),
        [
            ("", ("", "")),
            ("K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p", ("ns", "p")),
            ("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u", ("ns", "p")),
            ("IgnoreUnknown=TRUE;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_NAME=p", ("", "p")),
            ("K8sPodNamespace=a;K8sPodName=b", ("a", "b")),
            ("K8S_POD_NAME=p;K8S_POD_NAMESPACE=ns", ("ns", "p")),
        ],
    )
    def test_identity(self, args: str, identity: tuple[str, str]) -> None:
        got = cni.parse_cni_args(args)
        assert (got.namespace, got.name) == identity

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ("K8S_POD_NAME", 'ARGS: invalid pair "K8sPodName"'),
            ("a=b=c", 'ARGS: invalid pair "a=b=c"'),
            ("K8S_POD_NAME=p;X=1;Y=2", 'ARGS: unknown args ["X=1" "Y=2"]'),
            ("IgnoreUnknown=yes", 'ARGS: error parsing value of pair "IgnoreUnknown=yes": '
                                  "boolean unmarshal error: invalid input yes"),
            ("IgnoreUnknown=0;X=1", 'ARGS: unknown args ["X=1"]'),
        ],
    )  # fmt: skip
    def test_errors(self, args: str, message: str) -> None:
        """Bad CNI_ARGS fail ADD with code 999 and LoadArgs' text."""
        rc, out = run(conf("1.0.0"), CNI_ARGS=args)
        assert (rc, out) == (1, error(999, message))

    def test_missing_identity_passes_through(self) -> None:
        """Without namespace or name there is no lookup: the result is printed as is."""
        rc, out = run((STDOUT / "prev-100.stdin.json").read_bytes(), CNI_ARGS="K8S_POD_NAME=p")
        assert (rc, out) == (0, (STDOUT / "prev-100.stdout").read_bytes())


class TestBoundary:
    """The applet's own error boundary."""

    def test_unexpected_exception_is_999_json(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """A bug becomes CNI error 999 on stdout, never a traceback."""

        def boom(*_args: object) -> None:
            raise RuntimeError("kaboom")

        monkeypatch.setitem(commands.HANDLERS, "ADD", boom)
        assert run(conf("1.0.0")) == (1, error(999, "RuntimeError: kaboom"))

    def test_help(self) -> None:
        out = io.BytesIO()
        applet = find_applet("linkerd-cni")
        assert applet is not None
        assert run_applet(applet, ["linkerd-cni", "--help"], {}, (io.BytesIO(), out, out)) == 0
        assert out.getvalue().startswith(b"usage: linkerd-cni")
