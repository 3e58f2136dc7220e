"""The repair controller's command line, parsed as upstream's clap parser does: `--flag value`
or `--flag=value`, each upstream flag also read from its `LINKERD_CNI_REPAIR_CONTROLLER_*`
variable (the flag wins; an empty variable counts as unset), kubert's client and admin flags,
and cnibox's own additions (named as such in the usage text).

Rules of this module: pure; every refusal is a UsageError in clap's words (exit status 2);
`-h`/`--help`/`-V`/`--version` end parsing as clap's do and come back as a `Show` for the
dispatcher to answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from multicall.core.usage import Show
from multicall.errors import UsageError

ENV_PREFIX = "LINKERD_CNI_REPAIR_CONTROLLER_"
DEFAULT_LOG_LEVEL = "linkerd_cni_repair_controller=info,warn"
DEFAULT_ADMIN_ADDR = "0.0.0.0:9990"  # upstream's chart value (kubert's own default is :8080)

# flag -> (option field, env variable or "", default or None)
VALUED: dict[str, tuple[str, str, str | None]] = {
    "--log-level": ("log_level", ENV_PREFIX + "LOG_LEVEL", DEFAULT_LOG_LEVEL),
    "--log-format": ("log_format", ENV_PREFIX + "LOG_FORMAT", "plain"),
    "--node-name": ("node_name", ENV_PREFIX + "NODE_NAME", None),
    "--controller-pod-name": ("controller_pod_name", ENV_PREFIX + "POD_NAME", None),
    "--cluster": ("cluster", "", ""),
    "--context": ("context", "", ""),
    "--user": ("user", "", ""),
    "--kubeconfig": ("kubeconfig", "", ""),
    "--as": ("impersonate_user", "", ""),
    "--as-group": ("impersonate_group", "", ""),
    "--kube-api-response-headers-timeout": ("headers_timeout", "", "9s"),
    "--admin-addr": ("admin_addr", "", DEFAULT_ADMIN_ADDR),
    # cnibox's additions
    "--watch-timeout": ("watch_timeout", "", "290s"),
    "--error-delay": ("error_delay", "", "5s"),
    "--cni-net-dir": ("cni_net_dir", "", "/host/etc/cni/net.d"),
    "--cni-cache-dir": ("cni_cache_dir", "", "/host/var/lib/cni"),
    "--host-root": ("host_root", "", "/host"),
}
SWITCHES = {"--repair-in-place": "repair_in_place"}


@dataclass(frozen=True, slots=True)
class Options:
    """The repair controller's flags and environment, parsed."""

    log_level: str = DEFAULT_LOG_LEVEL
    log_format: str = "plain"
    node_name: str = ""
    controller_pod_name: str = ""
    cluster: str = ""
    context: str = ""
    user: str = ""
    kubeconfig: str = ""
    impersonate_user: str = ""
    impersonate_group: str = ""
    headers_timeout: float = 9.0
    admin_addr: str = DEFAULT_ADMIN_ADDR
    watch_timeout: float = 290.0
    error_delay: float = 5.0
    repair_in_place: bool = False
    cni_net_dir: str = "/host/etc/cni/net.d"
    cni_cache_dir: str = "/host/var/lib/cni"
    host_root: str = "/host"


_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
# ASCII digits only: `\d` would take any script's digits, which Go's ParseDuration refuses.
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """Seconds of a Go/kube-rs duration (`9s`, `1m30s`, `250ms`, `2h3m4s5ms`); a bare number
    is seconds (Go accepts only `0` bare)."""
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        total = float(text)
    elif not text:
        raise ValueError("invalid duration ''")
    else:
        pos, total = 0, 0.0
        while pos < len(text):
            match = _PART.match(text, pos)
            if match is None:
                raise ValueError(f"invalid duration {text[:100]!r}")
            total += float(match[1]) * _UNITS[match[2]]
            pos = match.end()
    if total > MAX_DURATION:  # float() of 400 digits is inf, not an error
        raise ValueError(f"invalid duration {text[:100]!r}")
    return total


MAX_DURATION = (2**63 - 1) / 1e9  # Go's time.Duration: int64 nanoseconds


def parse_args(args: Sequence[str], env: Mapping[str, str]) -> Options | Show:
    given = _scan(args)
    if isinstance(given, Show):
        return given
    values, switches = given
    for field, variable, default in VALUED.values():
        if field not in values:
            from_env = env.get(variable, "") if variable else ""
            if from_env:
                values[field] = from_env
            elif default is not None:
                values[field] = default
    missing = [
        f"  {flag} <{_meta(flag)}>" for flag, (field, _, _) in VALUED.items() if field not in values
    ]
    if missing:
        raise UsageError(
            _clap("the following required arguments were not provided:\n" + "\n".join(missing))
        )
    if values["log_format"] not in ("plain", "json"):
        raise UsageError(
            _clap(
                f"invalid value '{values['log_format']}' for '--log-format "
                f"<LOG_FORMAT>': invalid log level: {values['log_format']} "
                "must be 'plain' or 'json'"
            )
        )
    seconds = {field: _seconds(values, field, flag) for flag, field in DURATIONS.items()}
    if seconds["watch_timeout"] < 1:
        raise UsageError(_clap("--watch-timeout must be at least 1s"))
    strings = {k: v for k, v in values.items() if k not in seconds}
    return Options(**strings, **seconds, repair_in_place="repair_in_place" in switches)  # type: ignore[arg-type]


DURATIONS = {
    "--kube-api-response-headers-timeout": "headers_timeout",
    "--watch-timeout": "watch_timeout",
    "--error-delay": "error_delay",
}


def _scan(args: Sequence[str]) -> Show | tuple[dict[str, str], set[str]]:
    """The flags given on the command line (field -> value, switches), or the help/version
    request that ends parsing."""
    values: dict[str, str] = {}
    switches: set[str] = set()
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-h", "--help"):
            return Show.HELP
        if arg in ("-V", "--version"):
            return Show.VERSION
        flag, eq, inline = arg.partition("=")
        if flag in SWITCHES and not eq:
            switches.add(SWITCHES[flag])
            continue
        if flag not in VALUED:
            raise UsageError(_clap(f"unexpected argument '{arg}' found"))
        if not eq:
            if not rest or rest[0].startswith("--"):
                raise UsageError(
                    _clap(f"a value is required for '{flag} <{_meta(flag)}>' but none was supplied")
                )
            inline = rest.pop(0)
        field = VALUED[flag][0]
        if field in values:
            raise UsageError(
                _clap(f"the argument '{flag} <{_meta(flag)}>' cannot be used multiple times")
            )
        values[field] = inline
    return values, switches


def _seconds(values: Mapping[str, str], field: str, flag: str) -> float:
    try:
        return parse_duration(values[field])
    except ValueError as exc:
        raise UsageError(
            _clap(f"invalid value '{values[field]}' for '{flag} <{_meta(flag)}>': {exc}")
        ) from None


def _meta(flag: str) -> str:
    return VALUED[flag][0].upper()


def _clap(message: str) -> str:
    return f"error: {message}\n\nFor more information, try '--help'."
