"""Helpers shared by the test suites (never imported by cnibox itself).

The everyday names are here; the rest by module:

    paths.py           REPO, FIXTURES (tests/fixtures/, PROVENANCE.md inside)
    policy.py          require_root, require_tool, skip_or_fail (a skip fails under CI=true)
    cnibox.py          cnibox_argv, cnibox_executable: the source tree or $CNIBOX
    rig.py             throwaway network namespaces (node and pod netns, veths)
    pki.py             a test CA and server certificate (openssl CLI)
    kubeapi.py         a TLS Kubernetes API server for tests, and API documents
    kubewatch.py       a list/watch API server for controllers (pods, Events, faults)
    libcni/            the real libcni as the container runtime (Go driver, oracles)
    installer_host.py  a fake node for install-cni (host root, service-account dir)
    fakes.py           in-memory Kubernetes API and firewall for the plugin seam
    scenarios.py       the derived linkerd-iptables scenarios (options, save text, argv)
    pods.py            upstream's injected pods, and nat tables as save tools print them
    nft.py             nft codec test data (fixture rules, hypothesis RuleSpecs)
    artifact.py        the built single file (trailer, extraction cache)
    empty_root.py      the read-only chroot the artifact suites run the single file in
    validator.py       linkerd-network-validator's check, run inside a pod netns
    waiting.py         wait_for: poll a condition with a bound
    helm.py            the pinned helm and packaging/helm/manifests.py (chart, release)
    sbom.py            build/bundled.py's attribution and the SBOM checks of a real build
    scripts.py         load_script: a script of build/, packaging/ or bench/ as a module
    hostile.py         large hostile inputs, and peak RSS of a command (GNU time)
    hostile_api.py     an API stand-in that misbehaves on purpose (slow, endless, broken)
    fuzzing.py         the fuzz harness's settings and input strategies
"""

from tests.support.cnibox import cnibox_argv, cnibox_executable
from tests.support.paths import FIXTURES, REPO
from tests.support.policy import in_ci, require_root, require_tool, skip_or_fail

__all__ = [
    "FIXTURES",
    "REPO",
    "cnibox_argv",
    "cnibox_executable",
    "in_ci",
    "require_root",
    "require_tool",
    "skip_or_fail",
]
