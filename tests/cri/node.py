"""A throwaway Kubernetes node for the CRI suite: Debian's containerd with its CRI plugin, the
reference CNI plugins and linkerd-cni, a local pause image, all inside namespaces of its own.

Rules of this module:
1. Nothing runs in the machine's own network namespace: containerd, its shims, runc and every
   CNI plugin run in a "node" netns made by the rig, entered with `nsenter --net=` (not
   `ip netns exec`, which remounts /sys: runc then misses the cgroup mounts).
2. Nothing is left in the machine's filesystem: containerd runs in a private mount namespace
   with tmpfs over /run and /var/lib, so what containerd 1.6 writes to fixed paths (shim
   sockets in /run/containerd/s, libcni's result cache in /var/lib/cni) and every mount it makes
   (pod netns, shm, rootfs) stays there. A keeper process (the pause program) holds that
   namespace, so a restarted containerd finds its mounts as on a real node. The rest lives in
   one private directory. The tests reach pod netns through /proc/<keeper>/root.
3. Everything the node starts is in one cgroup tree (`/cbxcri-<pid>-<n>`): containerd and its
   children in `daemon`, each pod sandbox below it (the CRI cgroup_parent). Cleanup, also
   after failures and Ctrl-C, kills every process in that tree and in the mount namespace,
   removes the cgroups in every hierarchy, the directory and (through the rig) the netns.
   A run that was SIGKILLed leaves them behind; `sweep_leftovers` removes them next time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.cri.client import CriClient
from tests.support import REPO, require_tool
from tests.support.libcni import REFERENCE_PLUGINS
from tests.support.rig import Netns, Rig
from tests.support.scripts import load_script

PAUSE_SOURCE = Path(__file__).with_name("pause.c")
PAUSE_IMAGE = "localhost/cnibox/pause:test"
CONFLIST = "10-cnibox.conflist"  # the only file containerd loads (max_conf_num = 1)
KUBECONFIG = "ZZZ-linkerd-cni-kubeconfig"  # where the chart's installer writes it
BRIDGE = "cni0"
POD_SUBNET = "10.89.0.0/24"
CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "cbxcri"
# containerd's environment: what a node's init gives it, nothing of the test process.
NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_TIMEOUT = 30.0
# Where the launcher unpacks on the node, in its order of preference (build/launcher.c): the
# node's /var/lib and /run are tmpfs of its own, both usable.
LAUNCHER_CACHES = ("/var/lib/cnibox", "/run/cnibox")
STOP_TIMEOUT = 15.0
_counter = itertools.count()

# The keeper runs in the new mount namespace: fresh /run and /var/lib, the node's own.
# Both scripts first move themselves into the node's cgroup (the tracking hierarchy), so that
# whatever they exec and its children can be found and killed.
_KEEPER = (
    'echo $$ > "$1" && mount -t tmpfs -o mode=0755 cbxcri /run'
    ' && mount -t tmpfs -o mode=0755 cbxcri /var/lib && exec "$0"'
)
_ENTER_CGROUP = 'echo $$ > "$0" && exec "$@"'


# ----------------------------------------------------------------------------- pause image


def build_pause() -> Path:
    """The pause program, static (musl-gcc), cached in build/out by source hash."""
    cc = require_tool("musl-gcc")
    digest = hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest()[:16]
    out = REPO / "build" / "out" / f"cri-pause-{digest}"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        subprocess.run([cc, "-static", "-Os", "-s", "-o", str(tmp), str(PAUSE_SOURCE)],
                       check=True, capture_output=True)  # fmt: skip
        tmp.rename(out)
    return out


def _packaging_oci() -> ModuleType:
    """packaging/oci.py (a directory of build scripts, not a package): the project's own
    reproducible OCI writer, also used for the released images."""
    return load_script("packaging/oci.py")


def write_pause_archive(pause: Path, archive: Path) -> None:
    """An oci-archive holding one layer with /pause, tagged PAUSE_IMAGE (for `ctr import`)."""
    oci = _packaging_oci()
    image = oci.build_image(
        [oci.file("pause", pause.read_bytes(), 0o755)], oci.ImageConfig(entrypoint=["/pause"])
    )
    oci.write_archive(archive, image, PAUSE_IMAGE)


# ----------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class NodeDirs:
    """The node's private directory and what containerd and the plugins keep in it."""

    base: Path
    root: Path  # containerd's root (content, snapshots, metadata)
    state: Path  # containerd's state (tasks, sandboxes, pod netns mounts)
    conf: Path  # CNI conf_dir (net.d)
    bin: Path  # CNI bin_dir
    ipam: Path  # host-local's dataDir
    socket: Path
    config: Path
    log: Path  # containerd's stdout and stderr, and so the plugins' stderr

    @classmethod
    def under(cls, base: Path) -> NodeDirs:
        return cls(base, base / "root", base / "state", base / "net.d", base / "bin",
                   base / "ipam", base / "containerd.sock", base / "config.toml",
                   base / "containerd.log")  # fmt: skip

    @property
    def netns_dir(self) -> Path:
        """Where CRI bind-mounts pod netns (netns_mounts_under_state_dir)."""
        return self.state / "io.containerd.grpc.v1.cri" / "netns"


def containerd_config(dirs: NodeDirs) -> str:
    """containerd 1.6's config (version 2): private paths, CRI on, the pause image ours.

    - restrict_oom_score_adj: runc may not lower the pause process's oom_score_adj below
      containerd's own; this machine withholds CAP_SYS_RESOURCE, without which runc fails.
    - netns_mounts_under_state_dir: pod netns under the state dir, not /var/run/netns.
    - max_conf_num 1: the first conflist of conf_dir, as kubelet-era containerd loads it.
    - the runc runtime is declared whole (a runtimes table replaces the default one, and
      without runtime_type CRI fails: "container.Runtime.Name must be set").
    - opt's path is moved (it creates /opt/containerd otherwise); snapshotters that only log
      errors here (aufs, btrfs, devmapper, zfs) are disabled.
    """
    return f"""version = 2
root = "{dirs.root}"
state = "{dirs.state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{dirs.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dirs.base / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{dirs.bin}"
    conf_dir = "{dirs.conf}"
    max_conf_num = 1

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    Root = "{dirs.base / "runc"}"
    SystemdCgroup = false
"""


# ----------------------------------------------------------------------------- cgroups


def cgroup_mounts() -> list[Path]:
    """Every cgroup (v1 and v2) hierarchy mounted in this mount namespace."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            mounts.append(Path(before.split(" ")[4]))
    return mounts


def tracking_hierarchy() -> Path:
    """The hierarchy whose cgroup.procs lists the node's processes: v1 `pids`, else v2."""
    pids = CGROUP_ROOT / "pids"
    return pids if (pids / "cgroup.procs").exists() else CGROUP_ROOT


def cgroup_pids(top: Path) -> set[int]:
    found: set[int] = set()
    if not top.is_dir():
        return found
    for procs in top.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            found.update(int(pid) for pid in procs.read_text().split())
    return found


def remove_cgroup_tree(name: str) -> list[str]:
    """rmdir `/<name>` and everything below it in every hierarchy; what could not go."""
    left = []
    for mount in cgroup_mounts():
        top = mount / name
        if not top.is_dir():
            continue
        below = sorted((p for p in top.rglob("*") if p.is_dir()), key=_depth, reverse=True)
        for directory in [*below, top]:
            try:
                directory.rmdir()
            except OSError as e:
                left.append(f"{directory}: {e.strerror}")
    return left


def _depth(path: Path) -> int:
    return len(path.parts)


# ----------------------------------------------------------------------------- processes


def mount_ns_pids(mount_ns: str) -> set[int]:
    """Processes whose mount namespace is `mount_ns` (a `mnt:[inode]` link text)."""
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/mnt") == mount_ns:
                    found.add(int(entry.name))
    return found


def kill_all(find: Callable[[], set[int]], deadline: float = STOP_TIMEOUT) -> set[int]:
    """SIGKILL what `find` returns until it returns nothing (or the deadline); survivors."""
    end = time.monotonic() + deadline
    while True:
        pids = find() - {os.getpid()}
        if not pids or time.monotonic() > end:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> None:
    """Remove the cgroups, processes and directories of nodes whose test process is gone
    (named `cbxcri-<pid>-<n>`): what a SIGKILLed run could not clean up."""
    tracking = tracking_hierarchy()
    for top in tracking.glob(f"{PREFIX}-*-*"):
        owner = top.name.split("-")[1]
        if owner.isdigit() and not _alive(int(owner)):
            kill_all(functools.partial(cgroup_pids, top))
            remove_cgroup_tree(top.name)
    for base in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*-*"):
        owner = base.name.split("-")[1]
        if owner.isdigit() and not _alive(int(owner)):
            shutil.rmtree(base, ignore_errors=True)


# ----------------------------------------------------------------------------- the node


@dataclass
class CriNode:
    """One node: its netns, private directory, keeper, containerd and CRI client.

    `plugin` is what bin_dir's `linkerd-cni` links to. `setup` runs once the node's namespaces
    exist and before containerd starts (e.g. to `spawn` a node agent); what it returns is added
    to containerd's environment, which libcni passes on to every plugin it runs. Use as a
    context manager, or call start() and always cleanup().
    """

    rig: Rig
    plugin: str
    setup: Callable[[CriNode], Mapping[str, str]] | None = None
    env: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"{PREFIX}-{os.getpid()}-{next(_counter)}")
    netns: Netns = field(init=False)
    dirs: NodeDirs = field(init=False)
    cri: CriClient = field(init=False)
    keeper: subprocess.Popen[bytes] | None = None
    containerd: subprocess.Popen[bytes] | None = None
    spawned: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _mount_ns: str = ""

    # -- lifecycle

    def __enter__(self) -> CriNode:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def start(self) -> None:
        for tool in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter",
                     "unshare"):  # fmt: skip
            require_tool(tool)
        sweep_leftovers()
        pause = build_pause()
        self.dirs = NodeDirs.under(Path(tempfile.mkdtemp(prefix=f"{self.name}-")))
        self.netns = self.rig.node()
        for path in (self.dirs.conf, self.dirs.bin, self.dirs.ipam):
            path.mkdir()
        self._link_plugins()
        self.dirs.config.write_text(containerd_config(self.dirs))
        (self.tracking_cgroup / "daemon").mkdir(parents=True)
        self._start_keeper(pause)
        if self.setup is not None:
            self.env.update(self.setup(self))
        self.start_containerd()
        archive = self.dirs.base / "pause.tar"
        write_pause_archive(pause, archive)
        subprocess.run(
            ["ctr", "--address", str(self.dirs.socket), "--namespace", "k8s.io", "images",
             "import", str(archive)],
            check=True, capture_output=True, timeout=START_TIMEOUT,
        )  # fmt: skip
        self._wait(lambda: self.cri.has_image(PAUSE_IMAGE), "the pause image in CRI's store")

    def _link_plugins(self) -> None:
        (self.dirs.bin / "linkerd-cni").symlink_to(self.plugin)
        for name in ("bridge", "host-local", "loopback"):
            (self.dirs.bin / name).symlink_to(REFERENCE_PLUGINS / name)

    def _start_keeper(self, pause: Path) -> None:
        self.keeper = subprocess.Popen(
            ["nsenter", f"--net={self.netns.path}", "--", "unshare", "--mount",
             "--propagation", "private", "--", "sh", "-c", _KEEPER, str(pause), self._procs()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,  # Ctrl-C reaches pytest only; cleanup ends the node
        )  # fmt: skip
        keeper = self.keeper
        self._wait(lambda: _exe(keeper.pid) == str(pause), "the mount namespace keeper",
                   failed=lambda: keeper.poll() is not None)  # fmt: skip
        pid = keeper.pid
        self._mount_ns = os.readlink(f"/proc/{pid}/ns/mnt")
        assert self._mount_ns != os.readlink("/proc/self/ns/mnt")

    def start_containerd(self) -> None:
        env = {"PATH": NODE_PATH, **self.env}
        with self.dirs.log.open("ab") as log:
            self.containerd = subprocess.Popen(
                [*self.enter_argv(), "sh", "-c", _ENTER_CGROUP, self._procs(),
                 "containerd", "--config", str(self.dirs.config)],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        self.cri = CriClient(str(self.dirs.socket))
        daemon = self.containerd
        self._wait(self._runtime_ready, "containerd's CRI plugin",
                   failed=lambda: daemon.poll() is not None)  # fmt: skip

    def _runtime_ready(self) -> bool:
        if not self.dirs.socket.exists():
            return False
        try:
            return self.cri.conditions().get("RuntimeReady", (False, ""))[0]
        except Exception:  # noqa: BLE001 - grpc's UNAVAILABLE while containerd boots
            return False

    def stop_containerd(self) -> None:
        """SIGTERM, as a service manager stops it; shims and pods keep running."""
        if self.containerd is None:
            return
        with contextlib.suppress(Exception):
            self.cri.close()
        self.containerd.terminate()
        try:
            self.containerd.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.containerd.kill()
            self.containerd.wait()
        self.containerd = None

    def restart_containerd(self, *, empty_caches: bool) -> None:
        """Stop containerd; with `empty_caches`, delete libcni's result cache and cnibox's
        unpacked payload (all on the node's tmpfs, as after a reboot of a node whose /var is
        not kept); start it again in the same namespaces."""
        self.stop_containerd()
        if empty_caches:
            for path in ("/var/lib/cni", *LAUNCHER_CACHES):
                shutil.rmtree(self.inside(path), ignore_errors=True)
        self.start_containerd()

    def unpacked(self) -> bool:
        """Whether cnibox's launcher has unpacked its payload on the node (docs/binary.md)."""
        return any(self.inside(path).is_dir() for path in LAUNCHER_CACHES)

    def spawn(
        self, argv: list[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a node-level process (e.g. the node agent) in the node's netns, mount namespace
        and cgroup; it is killed at cleanup."""
        with self.dirs.log.open("ab") as log:
            proc = subprocess.Popen(
                [*self.enter_argv(), "sh", "-c", _ENTER_CGROUP, self._procs(), *argv],
                env={"PATH": NODE_PATH, **(env or {})}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        self.spawned.append(proc)
        return proc

    def cleanup(self) -> None:
        """Remove everything the node made, whatever state it is in. Never raises for what it
        could remove; raises AssertionError naming what it could not."""
        problems: list[str] = []
        if self.containerd is not None and self.containerd.poll() is None:
            # End pods as kubelet would, so the plugin's DEL runs; bounded, best effort.
            with contextlib.suppress(Exception):
                for sandbox in self.cri.sandbox_ids():
                    self.cri.stop(sandbox)
                    self.cri.remove(sandbox)
        with contextlib.suppress(Exception):
            self.stop_containerd()
        if self.keeper is not None:
            ns = self._mount_ns
            survivors = kill_all(
                lambda: (mount_ns_pids(ns) if ns else set()) | cgroup_pids(self.tracking_cgroup)
            )
            problems += [f"process {pid} survived SIGKILL" for pid in survivors]
            self.keeper.wait()
            if self.keeper.stderr is not None:
                self.keeper.stderr.close()
        for proc in self.spawned:
            proc.wait()
        problems += remove_cgroup_tree(self.name)
        if hasattr(self, "dirs"):
            shutil.rmtree(self.dirs.base, ignore_errors=True)
            if self.dirs.base.exists():
                problems.append(f"{self.dirs.base} could not be removed")
        if hasattr(self, "netns"):
            self.rig.remove(self.netns)
        if problems:
            raise AssertionError("CRI node cleanup left: " + "; ".join(problems))

    # -- what tests use

    @property
    def cgroup_parent(self) -> str:
        """The CRI cgroup_parent for this node's pods (cgroupfs syntax)."""
        return f"/{self.name}"

    @property
    def tracking_cgroup(self) -> Path:
        return tracking_hierarchy() / self.name

    def _procs(self) -> str:
        return str(self.tracking_cgroup / "daemon" / "cgroup.procs")

    def enter_argv(self) -> list[str]:
        """argv prefix that runs a program where containerd runs (node netns + mount ns)."""
        assert self.keeper is not None
        return ["nsenter", f"--net={self.netns.path}", f"--mount=/proc/{self.keeper.pid}/ns/mnt",
                "--"]  # fmt: skip

    def inside(self, path: str) -> Path:
        """A path of the node's mount namespace (e.g. a pod netns), reachable from here."""
        assert self.keeper is not None
        return Path(f"/proc/{self.keeper.pid}/root{path}")

    def write_conf(self, name: str, data: bytes) -> None:
        """Write a file into conf_dir the way installers do: a temporary file in the same
        directory, then rename. (containerd 1.6 ignores a conflist renamed into conf_dir from
        another directory: its watcher only reloads on events for that directory's files.)"""
        tmp = self.dirs.conf / f".{name}.tmp{os.getpid()}"
        tmp.write_bytes(data)
        tmp.rename(self.dirs.conf / name)

    def use_conflist(self, conflist: Mapping[str, Any]) -> None:
        """Install the network list and wait until containerd's CNI plugin has loaded it."""
        self.write_conf(CONFLIST, json.dumps(conflist, indent=2).encode())
        expected = [json.loads(json.dumps(conflist))]
        self._wait(lambda: self.cri.loaded_cni_config() == expected,
                   "containerd to load the new conflist")  # fmt: skip

    def pod_netns(self, netns: str) -> str:
        """The path, from here, of a pod netns path containerd reported."""
        return str(self.inside(netns))

    def in_pod(self, netns: str, argv: list[str]) -> str:
        """Run a host tool (an oracle such as iptables-save) inside a pod's netns."""
        proc = subprocess.run(["nsenter", f"--net={self.pod_netns(netns)}", "--", *argv],
                              capture_output=True, text=True, check=False, timeout=60)  # fmt: skip
        if proc.returncode != 0:
            raise AssertionError(f"{argv} in {netns} failed: {proc.stderr.strip()}")
        return proc.stdout

    def log_text(self) -> str:
        return self.dirs.log.read_text(errors="replace")

    # -- helpers

    def _wait(
        self, ready: Callable[[], bool], what: str, *, failed: Callable[[], bool] | None = None
    ) -> None:
        end = time.monotonic() + START_TIMEOUT
        while not ready():
            if failed is not None and failed():
                raise AssertionError(f"{what} exited early:\n{self._log_tail()}")
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}:\n{self._log_tail()}")
            time.sleep(0.05)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_text().splitlines()[-20:])
        return ""


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""
