"""dist/cnibox-arm64 in a full-system arm64 VM: the firewall paths qemu-user cannot run.

One boot of Debian's arm64 kernel under qemu-system-aarch64 (tests/arm64/vm.py) runs, for each
iptables mode (legacy: libiptc; nft: nf_tables netlink), what the x86_64 empty-root suite's
`case_linkerd_cni` and `case_iptables_verify` do: the plugin ADD of the meshed pod against the
test API server, the pod netns' nat table printed by Debian's arm64 iptables-<mode>-save (the
oracle) and compared with upstream's golden, `iptables-verify --netns` passing, then failing
with the rule named once a chain is flushed. One boot serves every step (a boot costs ~10 s,
the first start of the binary under TCG more). Runs in `make test-arm64` (after the qemu-user
stage) and alone in `make test-arm64-vm`; needs root (netns for QEMU and the API server).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.arm64 import vm
from tests.arm64.vm_stage import booted, require_vm_stage
from tests.support.oracles import SAVE
from tests.support.pods import MESHED
from tests.support.scenarios import comparable_save, fixture_text

pytestmark = [pytest.mark.binary, pytest.mark.netns, pytest.mark.slow]
BOOT_TIMEOUT = 1200
MODES = {"legacy": "default-legacy", "nft": "default-nft"}


def guest_script() -> str:
    script = ""
    for mode in MODES:
        pod = f"/var/run/netns/pod-{mode}"
        meta = MESHED["metadata"]
        cni_env = (
            f"CNI_COMMAND=ADD CNI_CONTAINERID=cbx-arm64-{mode} CNI_NETNS={pod} CNI_IFNAME=eth0 "
            f"CNI_PATH=/ 'CNI_ARGS=K8S_POD_NAMESPACE={meta['namespace']};"
            f"K8S_POD_NAME={meta['name']}'"
        )
        verify = (
            f"/iptables-verify --config /in/netconf-{mode}.json --pod /in/pod.json "
            f"--netns {pod} --mode {mode}"
        )
        script += f"/bin/ip netns add pod-{mode}\n"
        script += vm.step(f"add-{mode}", f"env -i {cni_env} /linkerd-cni < /in/add-{mode}.json")
        script += vm.step(f"save-{mode}", f"/bin/ip netns exec pod-{mode} {SAVE[mode]} -t nat")
        script += vm.step(f"verify-{mode}", verify)
        flush = f"iptables-{mode} -t nat -F PROXY_INIT_OUTPUT"
        script += vm.step(f"flush-{mode}", f"/bin/ip netns exec pod-{mode} {flush}")
        script += vm.step(f"verify-broken-{mode}", verify)
    return script


@pytest.fixture(scope="module")
def boot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vm.Boot]:
    """One boot running every step; the API server listens in QEMU's throwaway netns."""
    require_vm_stage()  # before a directory is made for nothing
    work = tmp_path_factory.mktemp("arm64-vm")
    with booted(work, MODES, guest_script(), timeout=BOOT_TIMEOUT) as result:
        print(f"arm64 VM: booted, ran the {'/'.join(MODES)} steps, off in {result.seconds:.0f} s")
        yield result


def test_vm_booted_the_arm64_kernel(boot: vm.Boot) -> None:
    """All modules loaded (each failure is reported on the console) and the script ran."""
    assert "@@cbx-booted" in boot.console
    assert "@@cbx-module-failed" not in boot.console
    assert "@@cbx-done" in boot.console


@pytest.mark.parametrize("mode", sorted(MODES))
def test_plugin_add_programs_upstream_rules(boot: vm.Boot, mode: str) -> None:
    """ADD returns the previous result and leaves exactly upstream's nat table, as Debian's
    arm64 iptables-<mode>-save prints it."""
    out, rc = boot.section(f"add-{mode}")
    assert rc == 0, out + boot.section(f"add-{mode}.stderr")[0]
    assert json.loads(out)["ips"] == [{"address": "10.89.0.7/24"}]
    assert f"ipv4 nat via {mode}: created" in boot.section(f"add-{mode}.stderr")[0]
    save, rc = boot.section(f"save-{mode}")
    assert rc == 0, save
    assert comparable_save(save) == fixture_text(MODES[mode])


@pytest.mark.parametrize("mode", sorted(MODES))
def test_iptables_verify_netns(boot: vm.Boot, mode: str) -> None:
    """iptables-verify dumps the pod netns itself: OK after ADD; exit 1 naming the flushed
    chain's rules once PROXY_INIT_OUTPUT is emptied by the oracle."""
    out, rc = boot.section(f"verify-{mode}")
    assert rc == 0, out
    flush, rc = boot.section(f"flush-{mode}")
    assert rc == 0, flush
    broken, rc = boot.section(f"verify-broken-{mode}")
    assert rc == 1, broken
    missing = [line for line in broken.splitlines() if line.endswith("# missing")]
    assert len(missing) == 3, broken
    assert all(line.startswith("- -A PROXY_INIT_OUTPUT ") for line in missing), broken
