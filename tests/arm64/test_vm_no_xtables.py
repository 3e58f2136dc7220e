"""dist/cnibox-arm64 on an arm64 kernel without x_tables: `iptables-mode: nftables` programs
and serves traffic, the iptables-nft mode fails naming what is missing and the native mode.

The kernel Talos 1.14+ heads to keeps nf_tables and drops x_tables (issue 28). This boot of
tests/arm64/vm.py loads only `vm.NATIVE_MODULES` (nf_tables, its nat chain and redirect,
veth, the NIC): x_tables, nft_compat, ip(6)_tables and every xt_* are modules of this kernel
(its config says so, checked below) that are not in the initramfs, and the guest has no
modprobe for the kernel's request_module, so nothing can load them; the guest's
/proc/modules after the run proves none was. In it:

- the plugin ADD in `nftables` mode succeeds, `iptables-verify --mode nftables` reads the
  tables back as expected, and real connections (busybox nc over a veth pair into the pod
  netns) land where Linkerd's redirect sends them: inbound to an app port on the proxy's
  inbound port, to an ignored port on the app; outbound as root on the proxy's outbound
  port, as the proxy's uid (`netns-exec -S`) on the real destination;
- the plugin ADD in `nft` (iptables-nft) mode fails with CNI error JSON whose message names
  the refused rule and whose details name nft_compat/xt_* and `iptables-mode "nftables"`.

One boot; runs with the other VM stage in `make test-arm64` and `make test-arm64-vm`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.arm64 import vm
from tests.arm64.vm_stage import booted, require_vm_stage
from tests.support.pods import MESHED

pytestmark = [pytest.mark.binary, pytest.mark.netns, pytest.mark.slow]
BOOT_TIMEOUT = 1200
MODES = ("nftables", "nft")
POD, HOST = "10.89.0.7", "10.89.0.1"
PROXY_UID = 2102  # the golden pod's proxy uid (its PROXY_INIT_OUTPUT's --uid-owner)
# Each listener answers one connection with its name: where a connection landed.
POD_LISTENERS = {4143: "proxy-inbound", 4140: "proxy-outbound", 4190: "app-admin-4190"}
HOST_LISTENER = (9999, "host-direct")


def _listen(port: int, name: str, netns: str = "") -> str:
    where = f"/bin/ip netns exec {netns} " if netns else ""
    return f"( echo {name} | {where}nc -l -p {port} -w 120 >/dev/null 2>&1 & )\n"


def _connect(step: str, target: str, port: int, *, netns: str = "", uid: int = -1) -> str:
    if uid >= 0:
        prefix = f"/netns-exec --net=/var/run/netns/{netns} -S {uid} -G {uid} "
    else:
        prefix = f"/bin/ip netns exec {netns} " if netns else ""
    # busybox nc ends when the peer closes; stdin kept open so the listener's answer, then its
    # close (after its own stdin's end), come first.
    return vm.step(step, f"sleep 2 | {prefix}nc -w 5 {target} {port}")


def guest_script() -> str:
    meta = MESHED["metadata"]
    script = ""
    for mode in MODES:
        pod = f"/var/run/netns/pod-{mode}"
        cni_env = (
            f"CNI_COMMAND=ADD CNI_CONTAINERID=cbx-noxt-{mode} CNI_NETNS={pod} CNI_IFNAME=eth0 "
            f"CNI_PATH=/ 'CNI_ARGS=K8S_POD_NAMESPACE={meta['namespace']};"
            f"K8S_POD_NAME={meta['name']}'"
        )
        script += f"/bin/ip netns add pod-{mode}\n"
        script += vm.step(f"add-{mode}", f"env -i {cni_env} /linkerd-cni < /in/add-{mode}.json")
    verify = (
        "/iptables-verify --config /in/netconf-nftables.json --pod /in/pod.json "
        "--netns /var/run/netns/pod-nftables --mode nftables"
    )
    script += vm.step("verify-nftables", verify)
    # The pod's network: a veth pair, the pod end as eth0 in the pod netns.
    netns = "pod-nftables"
    script += vm.step(
        "wire",
        f"/bin/ip link add cbxhost type veth peer name eth0 netns {netns} && "
        f"/bin/ip addr add {HOST}/24 dev cbxhost && /bin/ip link set cbxhost up && "
        f"/bin/ip -n {netns} addr add {POD}/24 dev eth0 && "
        f"/bin/ip -n {netns} link set eth0 up && /bin/ip -n {netns} link set lo up",
    )
    for port, name in POD_LISTENERS.items():
        script += _listen(port, name, netns)
    script += "sleep 1\n"
    script += _connect("in-app-port", POD, 8080)
    script += _connect("in-ignored-port", POD, 4190)
    script += _listen(*HOST_LISTENER)
    script += "sleep 1\n"
    script += _connect("out-as-proxy", HOST, HOST_LISTENER[0], netns=netns, uid=PROXY_UID)
    script += _connect("out-as-root", HOST, HOST_LISTENER[0], netns=netns)
    script += vm.step("modules", "cat /proc/modules")
    script += vm.step("initramfs-modules", "ls -R /mod")
    return script


@pytest.fixture(scope="module")
def boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vm.Boot]:
    """One boot of the x_tables-free kernel running every step."""
    require_vm_stage()  # before a directory is made for nothing
    work = tmp_path_factory.mktemp("arm64-vm-noxt")
    with booted(
        work, MODES, guest_script(), timeout=BOOT_TIMEOUT, modules=vm.NATIVE_MODULES
    ) as result:
        print(
            f"arm64 VM without x_tables: ran the {'/'.join(MODES)} steps in {result.seconds:.0f} s"
        )
        yield result


def test_the_kernel_has_x_tables_only_as_modules_none_loaded(boot: vm.Boot) -> None:
    """x_tables and nft_compat are modules of this kernel (not built in), none of them is in
    the initramfs, and after every step none is loaded; nf_tables is."""
    config = vm.kernel().config()
    assert config["CONFIG_NETFILTER_XTABLES"] == "m"
    assert config["CONFIG_NFT_COMPAT"] == "m"
    assert "@@cbx-module-failed" not in boot.console
    assert "@@cbx-done" in boot.console
    listing, rc = boot.section("initramfs-modules")
    assert rc == 0, listing
    files = [name for name in listing.split() if name.endswith(".ko")]
    assert "nf_tables.ko" in files
    assert not [f for f in files if vm.XTABLES_MODULE.match(f.removesuffix(".ko"))], files
    modules, rc = boot.section("modules")
    assert rc == 0, modules
    loaded = [line.split()[0] for line in modules.splitlines() if line.strip()]
    assert {"nf_tables", "nft_redir"} <= set(loaded), loaded
    assert not [m for m in loaded if vm.XTABLES_MODULE.match(m)], loaded


def test_native_mode_programs_the_redirect(boot: vm.Boot) -> None:
    out, rc = boot.section("add-nftables")
    err = boot.section("add-nftables.stderr")[0]
    assert rc == 0, out + err
    assert json.loads(out)["ips"] == [{"address": f"{POD}/24"}]
    assert "ipv4 linkerd-proxy-init via nftables: table replaced" in err
    verify, rc = boot.section("verify-nftables")
    assert rc == 0, verify + boot.section("verify-nftables.stderr")[0]


@pytest.mark.parametrize(
    ("step", "landed"),
    [
        ("in-app-port", "proxy-inbound"),  # redirect-all-incoming-to-proxy-port
        ("in-ignored-port", "app-admin-4190"),  # ignore-port-4191,4190
        ("out-as-proxy", "host-direct"),  # ignore-proxy-user-id
        ("out-as-root", "proxy-outbound"),  # redirect-all-outgoing-to-proxy-port
    ],
)
def test_native_mode_serves_traffic(boot: vm.Boot, step: str, landed: str) -> None:
    """Each connection reads the name of the listener it reached."""
    wired, rc = boot.section("wire")
    assert rc == 0, wired + boot.section("wire.stderr")[0]
    out, rc = boot.section(step)
    assert (rc, out.strip()) == (0, landed), out + boot.section(f"{step}.stderr")[0]


def test_iptables_nft_mode_fails_naming_the_kernel_feature_and_the_native_mode(
    boot: vm.Boot,
) -> None:
    out, rc = boot.section("add-nft")
    err = boot.section("add-nft.stderr")[0]
    assert rc == 1, out + err
    error = json.loads(out)
    assert error["code"] == 999
    assert re.match(r"nf_tables refused -A \w+ .*: No such file or directory", error["msg"]), error
    assert "nft_compat" in error["details"], error
    assert "xt_*" in error["details"], error
    assert 'iptables-mode "nftables"' in error["details"], error
    assert "Traceback" not in err
