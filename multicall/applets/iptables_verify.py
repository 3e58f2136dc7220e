"""usage: iptables-verify --config NETCONF.json [--pod POD.json] [--namespace-object NS.json] [--service SVC.json] (--input FILE|- | --netns PATH | --pid PID) [--family ipv4|ipv6] [--mode legacy|nft] [--strict] [--json] [--quiet]

Compare the nat table a pod has with the one linkerd-cni would give it, and print the
difference as a unified diff (or JSON). The expected rules come from the same code as the
plugin's ADD: the network config, the pod's annotations, the namespace's annotations and, for
control-plane pods, the `default/kubernetes` service.

  --config FILE          the plugin's network config: one plugin object, or a conflist whose
                         `linkerd-cni` entry is used
  --pod FILE             the pod (JSON or YAML); without it, the config's defaults for a
                         meshed pod are expected; a pod the plugin skips expects no rules
  --namespace-object FILE
                         the pod's namespace, for annotations the pod does not set
  --service FILE         the `default/kubernetes` service (control-plane pods); without it
                         the plugin's fallback ports 443 and 6443 are expected
  --input FILE|-         read iptables-save / ip6tables-save output (either flavour); the last
                         `*nat` block is compared
  --netns PATH           dump the nat table of that network namespace (no iptables needed)
  --pid PID              the same for the network namespace of process PID
  --family ipv4|ipv6     which family's rules are expected and dumped (default ipv4)
  --mode legacy|nft|nftables
                         kernel interface to dump (default: the config's iptables-mode);
                         nftables compares the native linkerd-proxy-init table of the
                         family as `nft list table` prints it (--input: that text, or
                         `nft list ruleset` output) and shows a diff of the two texts
  --strict               compare the whole nat table, not only PROXY_INIT_* chains and the
                         rules jumping to them
  --json                 print the result as JSON (schema: docs/iptables-verify.md)
  --quiet                print nothing; the exit status says it all

Fetching the pod instead of reading files:
  --namespace NS --pod NAME
                         get the pod (and, when the plugin would, its namespace and the
                         `default/kubernetes` service) from the Kubernetes API, as ADD does
  --kubeconfig FILE      the kubeconfig to use (default: the config's kubernetes.kubeconfig;
                         its `linkerd-cni-context` is used, as the plugin does)

  -h, --help             this text
  --version              print the version

Exit status: 0 the rules match, 1 they differ, 2 usage or input error.
"""  # noqa: E501 - the usage line stays one line (the issue's exact text)

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import BinaryIO

from multicall.effects.streams import write_text
from multicall.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CniboxError,
    UsageError,
)
from multicall.plugin.verify import Options

PROG = "iptables-verify"


class InputError(CniboxError):
    """Anything that prevents the comparison: exit 2, so that 1 always means a mismatch."""

    exit_code = EXIT_USAGE


# ----------------------------------------------------------------------------- command line


def parse_args(args: Sequence[str]) -> Options:
    """The command line (core/usage.py's convention); UsageError for anything wrong."""
    from multicall.core import usage

    line = usage.parse(args, usage.options(__doc__ or ""))
    values: dict[str, str] = {}
    for name, value in line.given:
        if name in values and name not in _FLAGS:
            raise UsageError(f"option '{name}' given twice")
        values[name] = value
    return _options(values)


_FLAGS = ("--strict", "--json", "--quiet")


def _options(values: Mapping[str, str]) -> Options:
    if "--config" not in values:
        raise UsageError("--config NETCONF.json is required")
    sources = [s for s in ("--input", "--netns", "--pid") if s in values]
    if len(sources) != 1:
        raise UsageError("give exactly one of --input, --netns or --pid")
    files = ("--config", "--pod", "--namespace-object", "--service", "--input")
    if sum(1 for f in files if values.get(f) == "-") > 1:
        raise UsageError("only one input can come from stdin ('-')")
    if "--namespace" in values and "--pod" not in values:
        raise UsageError("--namespace NS needs --pod NAME")
    if "--pod" in values and "--namespace" not in values:
        _pod_file(values["--pod"])
    pid = values.get("--pid")
    if pid is not None and not 0 < _pid_number(pid) < 2**22:
        raise UsageError(f"--pid: {pid[:40]!r} is not a process id")
    return Options(
        config=values["--config"],
        pod=values.get("--pod"),
        namespace_object=values.get("--namespace-object"),
        namespace=values.get("--namespace"),
        kubeconfig=values.get("--kubeconfig"),
        service=values.get("--service"),
        input=values.get("--input"),
        netns=values.get("--netns"),
        pid=pid,
        family=_choice(values, "--family", ("ipv4", "ipv6")) or "ipv4",
        mode=_choice(values, "--mode", ("legacy", "nft", "nftables")),
        strict="--strict" in values,
        json="--json" in values,
        quiet="--quiet" in values,
    )


def _pid_number(text: str) -> int:
    """A pid as ASCII digits, any length (leading zeros free); 0 when it is not one."""
    from multicall.core.go.strconv import leading_uint64

    number = leading_uint64(text) if text else None
    return number[0] if number is not None and number[1] == len(text) else 0


def _pod_file(value: str) -> None:
    """Without --namespace, --pod is a file: a bare pod name that is no file is a usage
    error naming --namespace, not an unreadable file."""
    import os

    looks_like_name = "/" not in value and not value.endswith((".json", ".yaml", ".yml"))
    if value != "-" and looks_like_name and not os.path.exists(value):
        raise UsageError(
            f"--pod {value}: no such file; to fetch pod {value!r} from the Kubernetes API, "
            "give its --namespace too"
        )


def _choice(values: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    value = values.get(name)
    if value is not None and value not in allowed:
        raise UsageError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


# ----------------------------------------------------------------------------- wiring


def run(opts: Options, env: Mapping[str, str], stdin: BinaryIO, stdout: BinaryIO) -> int:
    from multicall.core.firewall.diff import diff_tables
    from multicall.plugin.verify import actual, expected, format_json, format_text

    want = expected(opts, stdin, env)
    if want.native:
        from multicall.plugin.verify import native_actual, native_report

        lines, source = native_actual(opts, stdin)
        if not opts.quiet:
            write_text(stdout, native_report(opts, want, lines, source))
        return EXIT_OK if lines == list(want.native) else EXIT_FAILURE
    got = actual(opts, want.mode, stdin)
    want = want.against(got.table)
    # A streamed --input keeps no other chain's rules unless --strict (plugin/verify.py).
    streamed = opts.input is not None and not opts.strict
    diff = diff_tables(
        want.table, got.table, strict=opts.strict, chains_known=not streamed, raw=got.raw
    )
    if not opts.quiet:
        render = format_json if opts.json else format_text
        write_text(stdout, render(diff, opts, want, got))
    return EXIT_OK if diff.ok else EXIT_FAILURE


def main(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdin: BinaryIO,
    stdout: BinaryIO,
    stderr: BinaryIO,
) -> int:
    opts = parse_args(argv[1:])
    try:
        return run(opts, env, stdin, stdout)
    except (UsageError, InputError):
        raise
    except CniboxError as exc:
        raise InputError(
            exc.message,
            hint=exc.hint,
            path=exc.path,
            netns=exc.netns,
            errno=exc.errno,
            details=exc.details,
        ) from exc
