"""What `install-cni` is told by its environment, and the texts it derives from it.

Rules of this module:
1. Variables, defaults and path joining follow the Go installer (`internal/cni/paths.go`):
   an empty variable counts as unset; paths are joined and cleaned like Go's `path.Join`, so
   `CONTAINER_MOUNT_PREFIX=/host` + `DEST_CNI_NET_DIR=/etc/cni/net.d` is `/host/etc/cni/net.d`.
2. cnibox additions: `SERVICE_ACCOUNT_DIR` (the token's directory, fixed in upstream),
   `CNI_CONF_NAME` (patch only that file name), `CNIBOX_HOST_BINARY` (where a Talos
   extension puts cnibox on the host), `CNIBOX_STATE_DIR` (the installer's own state: the
   undo journal and the pid file; default a hidden directory in the host CNI *bin* dir, a host
   volume every installer has, so it outlives the container, and one libcni only ever looks
   up plugins in by name. Not the config dir: upstream keeps nothing there but configs and
   kubeconfigs, its `linkerd check` integration test (`CheckCNIPluginIsLast`) says so, and
   other tools scan it; a state dir an older cnibox left there is taken over,
   installer/legacy.py) and
   `INSTALL_CNI_PID_FILE` (how `--uninstall` finds the running installer; default in the
   state dir) and `CNIBOX_HOST_CACHE` (where the node's launcher cache is mounted in the
   container; unset: nothing is unpacked at install time).
5. Every path from the environment is checked before anything is touched (`check_paths`):
   no `..` component anywhere, no NUL, file names (`CNI_CONF_NAME`) without `/`, and each
   joined path stays inside its directory (the kubeconfig inside the CNI config dir, the
   host dirs inside the mount prefix). Go's installer joins `KUBECONFIG_FILE_NAME=../../x`
   into a path outside the CNI dir; cnibox refuses it with a ConfigError naming the variable.
3. The network config is the first source that reads and is non-empty after replacing
   `__KUBECONFIG_FILEPATH__`; the environment wins over the file, as in Go.
4. The kubeconfig text is the Go template's, token and CA trimmed, CA base64-encoded, plus a
   final newline (the upstream expected files end with one). An IPv6 service host is put in
   brackets so the URL stays valid.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from multicall.errors import ConfigError

KUBECONFIG_PLACEHOLDER = b"__KUBECONFIG_FILEPATH__"

DEFAULTS: dict[str, str] = {
    "DEST_CNI_BIN_DIR": "/opt/cni/bin",
    "DEST_CNI_NET_DIR": "/etc/cni/net.d",
    "CNI_NETWORK_CONFIG_FILE": "",
    "CONTAINER_MOUNT_PREFIX": "/host",
    "KUBE_CA_FILE": "",
    "KUBECONFIG_FILE_NAME": "ZZZ-linkerd-cni-kubeconfig",
    "KUBERNETES_SERVICE_HOST": "",
    "KUBERNETES_SERVICE_PORT": "",
    "SERVICE_ACCOUNT_DIR": "/var/run/secrets/kubernetes.io/serviceaccount",
    "CNI_CONF_NAME": "",
    "CNIBOX_HOST_BINARY": "/usr/local/lib/cnibox/cnibox",
    "CNIBOX_STATE_DIR": "",
    "INSTALL_CNI_PID_FILE": "",
    "CNIBOX_HOST_CACHE": "",
}
STATE_DIR_NAME = ".cnibox-install-cni"  # in the host CNI bin dir (rule 2)
PID_FILE_NAME = "install-cni.pid"
JOURNAL_NAME = "undo.json"
RECORDS_NAME = "patched"  # one undo record per changed config (core/installer/journal.py)
BOOT_NAME = "boot"  # the boot the records were written in (installer/install.py `resume`)
# The extensions libcni loads from the config dir (libcni ConfFiles): no kubeconfig there.
LIBCNI_EXTENSIONS = (".conf", ".conflist", ".json")

KUBECONFIG_TEMPLATE = """\
# kubeconfig file for linkerd.io/cni-plugin
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://{host}:{port}
    certificate-authority-data: {ca}
users:
- name: linkerd-cni
  user:
    token: {token}
contexts:
- name: linkerd-cni-context
  context:
    cluster: local
    user: linkerd-cni
current-context: linkerd-cni-context
"""


def is_linkerd_kubeconfig(data: bytes) -> bool:
    """Whether `data` is a kubeconfig the installer (or upstream's, same text) wrote: only
    such a file is overwritten or removed at the kubeconfig's path."""
    return data.startswith(KUBECONFIG_TEMPLATE.partition("\n")[0].encode())


def go_path_join(*parts: str) -> str:
    """Go's path.Join: join the non-empty parts with '/', then clean."""
    joined = "/".join(p for p in parts if p)
    if not joined:
        return ""
    cleaned = posixpath.normpath(joined)
    # POSIX keeps a leading '//', Go's Clean does not.
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


@dataclass(frozen=True, slots=True)
class InstallerConfig:
    """The installer's settings; `host_*` paths are as the container sees the host."""

    net_dir: str
    bin_dir: str
    mount_prefix: str
    kubeconfig_name: str
    network_config_env: str
    network_config_file: str
    service_account_dir: str
    kube_ca_file: str
    service_host: str
    service_port: str
    conf_name: str
    host_binary: str
    state_dir_env: str
    pid_file_env: str
    host_cache: str  # container view of the node's launcher cache; "" = no install-time unpack
    # CNIBOX_HOST_BINARY was set (the chart's talos.extension): the node's own cnibox is
    # required, never replaced by a copy; unset, the default path is used when it is there
    host_binary_required: bool = False

    @property
    def host_net_dir(self) -> str:
        return go_path_join(self.mount_prefix, self.net_dir)

    @property
    def host_bin_dir(self) -> str:
        return go_path_join(self.mount_prefix, self.bin_dir)

    @property
    def kubeconfig_path(self) -> str:
        """Where the installer writes the kubeconfig (container view)."""
        return go_path_join(self.mount_prefix, self.net_dir, self.kubeconfig_name)

    @property
    def plugin_kubeconfig_path(self) -> str:
        """Where the plugin reads it (host view): what replaces the placeholder."""
        return go_path_join(self.net_dir, self.kubeconfig_name)

    @property
    def token_file(self) -> str:
        return go_path_join(self.service_account_dir, "token")

    @property
    def ca_file(self) -> str:
        return self.kube_ca_file or go_path_join(self.service_account_dir, "ca.crt")

    @property
    def host_binary_in_container(self) -> str:
        """The extension's cnibox as seen through the host mount."""
        return go_path_join(self.mount_prefix, self.host_binary)

    @property
    def state_dir(self) -> str:
        """The installer's own state (container view): undo journal, pid file."""
        return self.state_dir_env or go_path_join(self.host_bin_dir, STATE_DIR_NAME)

    @property
    def legacy_state_dir(self) -> str:
        """Where cnibox before issue 27 kept it (the host CNI config dir): taken over once."""
        return go_path_join(self.host_net_dir, STATE_DIR_NAME)

    @property
    def journal_path(self) -> str:
        return go_path_join(self.state_dir, JOURNAL_NAME)

    @property
    def records_dir(self) -> str:
        return go_path_join(self.state_dir, RECORDS_NAME)

    @property
    def boot_file(self) -> str:
        return go_path_join(self.state_dir, BOOT_NAME)

    @property
    def pid_file(self) -> str:
        return self.pid_file_env or go_path_join(self.state_dir, PID_FILE_NAME)


def parse_environment(env: Mapping[str, str]) -> InstallerConfig:
    """The installer's settings; ConfigError for a path that breaks rule 5."""

    def get(key: str) -> str:
        return env.get(key) or DEFAULTS[key]

    config = InstallerConfig(
        net_dir=get("DEST_CNI_NET_DIR"),
        bin_dir=get("DEST_CNI_BIN_DIR"),
        mount_prefix=get("CONTAINER_MOUNT_PREFIX"),
        kubeconfig_name=get("KUBECONFIG_FILE_NAME"),
        network_config_env=env.get("CNI_NETWORK_CONFIG", ""),
        network_config_file=get("CNI_NETWORK_CONFIG_FILE"),
        service_account_dir=get("SERVICE_ACCOUNT_DIR"),
        kube_ca_file=get("KUBE_CA_FILE"),
        service_host=get("KUBERNETES_SERVICE_HOST"),
        service_port=get("KUBERNETES_SERVICE_PORT"),
        conf_name=get("CNI_CONF_NAME"),
        host_binary=get("CNIBOX_HOST_BINARY"),
        state_dir_env=get("CNIBOX_STATE_DIR"),
        pid_file_env=get("INSTALL_CNI_PID_FILE"),
        host_cache=get("CNIBOX_HOST_CACHE"),
        host_binary_required=bool(env.get("CNIBOX_HOST_BINARY")),
    )
    check_paths(config)
    return config


# Variables holding paths (any component may be absolute or relative, never `..`).
PATH_VARIABLES = (
    ("DEST_CNI_NET_DIR", "net_dir"),
    ("DEST_CNI_BIN_DIR", "bin_dir"),
    ("CONTAINER_MOUNT_PREFIX", "mount_prefix"),
    ("KUBECONFIG_FILE_NAME", "kubeconfig_name"),
    ("CNI_NETWORK_CONFIG_FILE", "network_config_file"),
    ("SERVICE_ACCOUNT_DIR", "service_account_dir"),
    ("KUBE_CA_FILE", "kube_ca_file"),
    ("CNIBOX_HOST_BINARY", "host_binary"),
    ("CNIBOX_STATE_DIR", "state_dir_env"),
    ("INSTALL_CNI_PID_FILE", "pid_file_env"),
    ("CNIBOX_HOST_CACHE", "host_cache"),
)


def check_paths(config: InstallerConfig) -> None:
    """Rule 5: ConfigError naming the first variable whose path could leave its place."""
    for variable, attribute in PATH_VARIABLES:
        value = getattr(config, attribute)
        if "\0" in value or ".." in value.split("/"):
            raise ConfigError(
                f"{variable}={value!r}: a path from the environment may not contain '..'"
            )
    name = config.conf_name
    if "/" in name or name in (".", "..") or "\0" in name:
        raise ConfigError(f"CNI_CONF_NAME={name!r}: must be a file name (no '/')")
    inside = (
        (
            "KUBECONFIG_FILE_NAME",
            config.kubeconfig_name,
            config.kubeconfig_path,
            config.host_net_dir,
        ),
        ("DEST_CNI_NET_DIR", config.net_dir, config.host_net_dir, config.mount_prefix),
        ("DEST_CNI_BIN_DIR", config.bin_dir, config.host_bin_dir, config.mount_prefix),
    )
    for variable, value, path, parent in inside:
        if not is_inside(path, parent):
            raise ConfigError(f"{variable}={value!r}: {path} must lie inside {parent}")
    if config.kubeconfig_name.endswith(LIBCNI_EXTENSIONS):
        # libcni would load it as a network config, and a primary CNI's config of that
        # name would be overwritten by the kubeconfig and deleted by the undo.
        raise ConfigError(
            f"KUBECONFIG_FILE_NAME={config.kubeconfig_name!r}: a kubeconfig may not end in "
            f"{', '.join(LIBCNI_EXTENSIONS)}, the names libcni loads as network configs"
        )


def is_inside(path: str, parent: str) -> bool:
    """Whether the clean path `path` lies strictly below the clean directory `parent`."""
    return path.startswith(parent.rstrip("/") + "/") and path != parent


@dataclass(frozen=True, slots=True)
class SourceRead:
    """One network-config source and what reading it gave (None: it could not be read)."""

    name: str
    data: bytes | None


def source_names(config: InstallerConfig) -> tuple[str, str]:
    """The sources in Go's order: `env:CNI_NETWORK_CONFIG`, then `file:<path>`."""
    return ("env:CNI_NETWORK_CONFIG", f"file:{config.network_config_file}")


def substitute(data: bytes, plugin_kubeconfig_path: str) -> bytes:
    return data.replace(KUBECONFIG_PLACEHOLDER, plugin_kubeconfig_path.encode())


def choose_network_config(reads: Sequence[SourceRead], plugin_kubeconfig_path: str) -> bytes:
    """The first readable, non-empty source after substitution."""
    for read in reads:
        if read.data is None:
            continue
        data = substitute(read.data, plugin_kubeconfig_path)
        if data:
            return data
    raise ConfigError(
        "cannot build configuration from any known source",
        hint="set CNI_NETWORK_CONFIG to the linkerd-cni network config (the chart's "
        "cni_network_config), or CNI_NETWORK_CONFIG_FILE to a file holding it",
    )


def server_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def render_kubeconfig(token: bytes, ca: bytes, host: str, port: str) -> bytes:
    """The plugin's kubeconfig, with the Go installer's checks in its order."""
    import base64

    if not token:
        raise ConfigError("token-data is zero-length")
    if not ca:
        raise ConfigError("certificate authority data is zero-length")
    if not host:
        raise ConfigError("service-host is zero length")
    if not port:
        raise ConfigError("service-port is zero length")
    text = KUBECONFIG_TEMPLATE.format(
        host=server_host(host),
        port=port,
        ca=base64.b64encode(ca.strip()).decode("ascii"),
        token=token.strip().decode("utf-8", "replace"),
    )
    return text.encode("utf-8")
