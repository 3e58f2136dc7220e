"""packaging/: Talos rule check on Talos' own cases, the images (the chart and manifests:
test_helm_chart.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from multicall import __version__
from multicall.applets import all_names
from tests.support import FIXTURES, REPO, require_tool

PACKAGING = REPO / "packaging"
sys.path.insert(0, str(PACKAGING))
import oci  # noqa: E402  # packaging/ is a directory of scripts, not a package

CHECK = PACKAGING / "talos" / "check_extension.py"
TALOS_CASES = FIXTURES / "upstream" / "talos" / "extensions-testdata"

# Talos' TestLoadValidate / TestValidateFailures: case -> expected error ("" = valid).
TALOS_EXPECTED = {
    "good/extension1": "",
    "bad/wrongfiles": 'unexpected file "a"',
    "bad/emptymanifest": 'unsupported manifest version: ""',
    "bad/norootfs": "extension rootfs is missing",
    "bad/badpaths": 'path "/boot/vmlinuz" is not allowed in extensions',
    "bad/usrmerge": 'path "/usr/lib64/a.so" is not allowed in extensions',
}


def run_check(target: Path, *version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), str(target), *version],
        capture_output=True,
        text=True,
        check=False,
    )


class TestTalosRules:
    @pytest.mark.parametrize("case", sorted(TALOS_EXPECTED))
    def test_talos_own_cases(self, case: str) -> None:
        """The port gives Talos' verdict and error text on each of Talos' test extensions."""
        proc = run_check(TALOS_CASES / case, "1.0.0")
        expected = TALOS_EXPECTED[case]
        assert proc.returncode == (1 if expected else 0), proc.stderr
        assert proc.stderr.strip() == expected

    def test_version_constraint(self, tmp_path: Path) -> None:
        """compatibility.talos.version is enforced against the Talos version given."""
        ext = tmp_path / "ext"
        shutil.copytree(TALOS_CASES / "good" / "extension1", ext)
        manifest = ext / "manifest.yaml"
        manifest.chmod(0o644)
        manifest.write_text(manifest.read_text().replace(">= v1.0.0", ">= v1.6.0"))
        assert run_check(ext, "1.5.9").returncode == 1
        assert "can't be satisfied with Talos version 1.5.9" in run_check(ext, "1.5.9").stderr
        assert run_check(ext, "1.6.0").returncode == 0

    def test_world_writable_and_special_files(self, tmp_path: Path) -> None:
        """A world-writable file or a FIFO under rootfs is refused."""
        ext = tmp_path / "ext"
        shutil.copytree(TALOS_CASES / "good" / "extension1", ext)
        for path in ext.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        loose = ext / "rootfs" / "usr" / "local" / "lib" / "a.so"
        loose.chmod(0o666)
        assert 'world-writeable files are not allowed: "/usr/local/lib/a.so"' in (
            run_check(ext).stderr
        )
        loose.chmod(0o644)
        os.mkfifo(ext / "rootfs" / "usr" / "local" / "fifo")
        assert 'special files are not allowed: "/usr/local/fifo"' in run_check(ext).stderr


ARCHES = ("amd64", "arm64")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both images, multi-arch, from stand-in binaries (or $CNIBOX / $CNIBOX_ARM64 when set);
    `binary-<arch>` links to each platform's binary."""
    out = tmp_path_factory.mktemp("images")
    args = []
    for arch, variable in (("amd64", "CNIBOX"), ("arm64", "CNIBOX_ARM64")):
        binary = Path(os.environ.get(variable, out / f"cnibox-{arch}"))
        if not binary.exists():
            binary.write_bytes(b"\x7fELF stand-in for cnibox " + arch.encode() + b"\n")
        args += ["--binary", f"{arch}={binary}"]
        (out / f"binary-{arch}").symlink_to(binary)
    subprocess.run(
        [sys.executable, str(PACKAGING / "images.py"), *args, "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def layer_members(archive: Path, arch: str = "amd64") -> dict[str, tarfile.TarInfo]:
    with tarfile.open(archive) as outer:

        def read(name: str) -> bytes:
            member = outer.extractfile(name)
            assert member is not None
            return member.read()

        manifest = oci.platform_manifests(read)[arch]
        data = read("blobs/sha256/" + manifest["layers"][0]["digest"][7:])
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name.rstrip("/"): m for m in tar.getmembers()}


class TestImages:
    def test_talos_extension_passes_talos_rules(self, images: Path) -> None:
        """The extension tarball is valid for Talos 1.6 and later."""
        proc = run_check(images / "cnibox-talos-extension.tar", "1.6.0")
        assert proc.returncode == 0, proc.stderr

    def test_checker_reads_oci_layout_directories(self, images: Path) -> None:
        """The OCI layout directory beside each archive is checked the same way: the
        extension passes; the installer image is no extension, in Talos' words."""
        proc = run_check(images / "cnibox-talos-extension", "1.6.0")
        assert proc.returncode == 0, proc.stderr
        proc = run_check(images / "cnibox-installer")
        assert proc.returncode == 1
        assert proc.stderr.startswith('unexpected file "')

    def test_talos_extension_layout(self, images: Path) -> None:
        """manifest.yaml + rootfs/usr/local only; nothing world-writable; no /opt/cni/bin."""
        members = layer_members(images / "cnibox-talos-extension.tar")
        binary = members["rootfs/usr/local/lib/cnibox/cnibox"]
        assert binary.isfile()
        assert binary.mode == 0o755
        assert members["rootfs/usr/local/bin/netns-exec"].linkname == "/usr/local/lib/cnibox/cnibox"
        assert {n.split("/", 1)[0] for n in members} == {"manifest.yaml", "rootfs"}
        for name, member in members.items():
            if name.startswith("rootfs/") and not member.isdir():
                assert name.startswith("rootfs/usr/local/"), name
            assert member.issym() or not member.mode & 0o002, name
            assert (member.uid, member.gid, member.mtime) == (0, 0, 0), name
        assert not any("opt/cni" in n for n in members)
        assert "rootfs/usr/local/bin/nsenter" not in members  # never shadow util-linux-tools

    def test_talos_agent_service(self, images: Path) -> None:
        """The node agent's extension service (docs/agent.md): Talos' service format, the
        interface of NOTES.md, and a mount point in the read-only container root for each
        mount."""
        members = layer_members(images / "cnibox-talos-extension.tar")
        raw = members["rootfs/usr/local/etc/containers/cnibox-agent.yaml"]
        assert raw.isfile()
        service = yaml.safe_load((PACKAGING / "talos" / "cnibox-agent.yaml").read_text())
        assert service["name"] == "cnibox-agent"
        assert set(service) == {"name", "depends", "container", "restart"}
        container = service["container"]
        assert container["entrypoint"] == "/usr/local/lib/cnibox/cnibox"
        assert container["args"][:3] == ["agent", "--socket", "/var/run/linkerd-cni/agent.sock"]
        assert {"service": "cri"} in service["depends"]
        root = "rootfs/usr/local/lib/containers/cnibox-agent"
        for mount in container["mounts"]:
            assert members[f"{root}{mount['destination']}"].isdir(), mount["destination"]
            assert mount["type"] == "bind"
        sources = {m["source"]: m["options"] for m in container["mounts"]}
        assert "ro" in sources["/usr/local/lib/cnibox"]
        assert "rw" in sources["/var/run/linkerd-cni"]

    def test_talos_agent_service_is_a_talos_service_spec(self) -> None:
        """The service file against Talos' own definition (siderolabs/talos
        pkg/machinery/extensions/services/services.go, `Spec`, `Container`, `Security`,
        `Dependency` and their `Validate`, ported): only fields Talos knows, a valid name and
        restart kind, an entrypoint, exactly one condition per dependency, absolute paths;
        mounts as OCI's specs.Mount."""
        import re

        service = yaml.safe_load((PACKAGING / "talos" / "cnibox-agent.yaml").read_text())
        assert set(service) <= {"name", "container", "depends", "restart"}
        assert re.fullmatch(r"[-_a-z0-9]+", service["name"])
        assert service["restart"] in {"never", "always", "untilSuccess"}
        container = service["container"]
        assert set(container) <= {
            "entrypoint", "environment", "environmentFile", "args", "mounts", "security"
        }  # fmt: skip
        assert container["entrypoint"]
        assert all(isinstance(arg, str) for arg in container["args"])
        assert set(container.get("security", {})) <= {
            "writeableSysfs", "maskedPaths", "readonlyPaths", "writeableRootfs",
            "rootfsPropagation",
        }  # fmt: skip
        for mount in container["mounts"]:
            assert set(mount) <= {"destination", "type", "source", "options"}, mount
            assert mount["destination"].startswith("/"), mount
            assert all(isinstance(o, str) for o in mount.get("options", [])), mount
        for dependency in service["depends"]:
            assert len(dependency) == 1, dependency  # "more than a single dependency is set"
            [(kind, value)] = dependency.items()
            assert kind in {"service", "path", "network", "time"}, dependency
            if kind == "path":
                assert value.startswith("/"), dependency

    def test_talos_agent_service_has_the_keepers_view(self) -> None:
        """The service's keeper sees what the chart's agent sees (templates/agent.yaml): the
        CNI config dir and the runtime's CNI cache (flags and read-only mounts) and the pods'
        netns with propagation from the host (rslave: netns bound after the start appear);
        every mount point is a directory of the extension's read-only container root."""
        service = yaml.safe_load((PACKAGING / "talos" / "cnibox-agent.yaml").read_text())
        container = service["container"]
        args = container["args"]
        assert args[args.index("--cni-net-dir") + 1] == "/etc/cni/net.d"
        assert args[args.index("--cni-cache-dir") + 1] == "/var/lib/cni"
        mounts = {m["destination"]: m for m in container["mounts"]}
        for path in ("/etc/cni/net.d", "/var/run/netns", "/var/lib/cni"):
            assert mounts[path]["source"] == path
            assert "ro" in mounts[path]["options"]
            assert "rw" not in mounts[path]["options"]
        assert {"rbind", "rslave"} <= set(mounts["/var/run/netns"]["options"])
        layout = json.loads((PACKAGING / "talos" / "layout.json").read_text())
        root = "rootfs/usr/local/lib/containers/cnibox-agent"
        assert {f"{root}{path}" for path in mounts} <= set(layout["dirs"])

    def test_talos_agent_service_has_an_api_identity(self) -> None:
        """The service's identity is the kubeconfig install-cni writes (its default
        KUBECONFIG_FILE_NAME in the CNI config dir the service mounts), a path the agent's
        own command line accepts before the file exists (docs/agent.md "The agent's API
        identity")."""
        from multicall.applets.linkerd_cni_agent import parse_args
        from multicall.core.installer.config import DEFAULTS

        service = yaml.safe_load((PACKAGING / "talos" / "cnibox-agent.yaml").read_text())
        container = service["container"]
        args = container["args"]
        kubeconfig = args[args.index("--kubeconfig") + 1]
        assert kubeconfig == f"{DEFAULTS['DEST_CNI_NET_DIR']}/{DEFAULTS['KUBECONFIG_FILE_NAME']}"
        mounts = {m["destination"]: m for m in container["mounts"]}
        assert mounts["/etc/cni/net.d"]["source"] == "/etc/cni/net.d"
        assert "rbind" in mounts["/etc/cni/net.d"]["options"]
        assert parse_args(args[1:])["kubeconfig"] == kubeconfig  # not there here: accepted

    def test_talos_manifest_fields(self) -> None:
        """manifest.yaml carries the fields Talos reads, at this version of cnibox."""
        manifest = yaml.safe_load((PACKAGING / "talos" / "manifest.yaml").read_text())
        assert manifest["version"] == "v1alpha1"
        meta = manifest["metadata"]
        assert meta["name"] == "cnibox"
        assert meta["version"] == __version__
        assert meta["author"]
        assert meta["description"]
        assert meta["compatibility"]["talos"]["version"].startswith(">=")

    def test_installer_image_holds_only_cnibox_and_links(self, images: Path) -> None:
        """FROM scratch: the binary, one link per applet, /tmp; entrypoint install-cni."""
        members = layer_members(images / "cnibox-installer.tar")
        files = {n for n, m in members.items() if m.isfile()}
        assert files == {"usr/local/bin/cnibox"}
        links = {n.rsplit("/", 1)[1]: m.linkname for n, m in members.items() if m.issym()}
        assert links == dict.fromkeys(all_names(), "cnibox")
        assert "install-cni" in links

    def test_images_are_reproducible(self, images: Path, tmp_path: Path) -> None:
        """A second build from the same binaries gives byte-identical archives."""
        args = [f"--binary={arch}={images / f'binary-{arch}'}" for arch in ARCHES]
        subprocess.run(
            [sys.executable, str(PACKAGING / "images.py"), *args, "--out", str(tmp_path)],
            check=True,
            capture_output=True,
        )
        for name in ("cnibox-talos-extension.tar", "cnibox-installer.tar"):
            assert (tmp_path / name).read_bytes() == (images / name).read_bytes()

    @pytest.mark.parametrize("name", ["cnibox-talos-extension", "cnibox-installer"])
    def test_skopeo_inspects_both_forms(self, images: Path, name: str) -> None:
        """skopeo reads the layout directory and the oci-archive, same digest."""
        skopeo = require_tool("skopeo")
        digests = set()
        for ref in (
            f"oci:{images / name}:{__version__}",
            f"oci-archive:{images / name}.tar:{__version__}",
        ):
            out = subprocess.run(
                [skopeo, "inspect", ref], capture_output=True, text=True, check=True
            )
            digests.add(json.loads(out.stdout)["Digest"])
        assert len(digests) == 1

    def test_skopeo_config_of_the_installer(self, images: Path) -> None:
        """The installer's entrypoint runs install-cni."""
        skopeo = require_tool("skopeo")
        ref = f"oci:{images / 'cnibox-installer'}:{__version__}"
        out = subprocess.run(
            [skopeo, "inspect", "--config", ref], capture_output=True, text=True, check=True
        )
        config = json.loads(out.stdout)["config"]
        assert config["Entrypoint"] == ["/usr/local/bin/cnibox", "install-cni"]

    @pytest.mark.parametrize("name", ["cnibox-talos-extension", "cnibox-installer"])
    def test_both_forms_are_multi_arch_indexes(self, images: Path, name: str) -> None:
        """skopeo --raw: an OCI image index with one linux manifest per architecture, and
        each platform's config says its architecture."""
        skopeo = require_tool("skopeo")
        for ref in (f"oci:{images / name}:{__version__}",
                    f"oci-archive:{images / name}.tar:{__version__}"):  # fmt: skip
            raw = json.loads(
                subprocess.run(
                    [skopeo, "inspect", "--raw", ref], capture_output=True, text=True, check=True
                ).stdout
            )
            assert raw["mediaType"] == oci.INDEX_TYPE
            platforms = [
                (m["platform"]["os"], m["platform"]["architecture"]) for m in raw["manifests"]
            ]
            assert platforms == [("linux", arch) for arch in ARCHES]
        for arch in ARCHES:
            config = json.loads(
                subprocess.run(
                    [skopeo, "inspect", "--config", f"oci:{images / name}:{__version__}-{arch}"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            )
            assert (config["os"], config["architecture"]) == ("linux", arch)

    @pytest.mark.parametrize("arch", ARCHES)
    def test_umoci_unpacks_the_extension(self, images: Path, tmp_path: Path, arch: str) -> None:
        """umoci unpack --rootless of each platform gives the extension tree with that
        platform's binary, which passes Talos' rules."""
        root = umoci_unpack(images / "cnibox-talos-extension", arch, tmp_path / "bundle")
        binary = root / "rootfs" / "usr" / "local" / "lib" / "cnibox" / "cnibox"
        assert binary.read_bytes() == (images / f"binary-{arch}").read_bytes()
        assert stat.S_IMODE(binary.stat().st_mode) == 0o755
        proc = run_check(root)
        assert proc.returncode == 0, proc.stderr

    @pytest.mark.parametrize("arch", ARCHES)
    def test_umoci_unpacks_the_installer(self, images: Path, tmp_path: Path, arch: str) -> None:
        """Each platform's installer image unpacks to its binary, the applet links and a
        sticky /tmp."""
        root = umoci_unpack(images / "cnibox-installer", arch, tmp_path / "bundle")
        binary = root / "usr" / "local" / "bin" / "cnibox"
        assert binary.read_bytes() == (images / f"binary-{arch}").read_bytes()
        assert os.readlink(root / "usr" / "local" / "bin" / "install-cni") == "cnibox"
        assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777

    def test_talos_rules_are_checked_on_every_platform(self, images: Path, tmp_path: Path) -> None:
        """A multi-arch extension whose arm64 image breaks Talos' rules is refused."""
        sys.path.insert(0, str(PACKAGING))
        import images as packaging_images

        good = packaging_images.talos_entries(b"\x7fELF")
        bad = [*good, oci.file("rootfs/boot/vmlinuz", b"x")]
        index = oci.build_index(
            {"amd64": oci.build_image(good, oci.ImageConfig()),
             "arm64": oci.build_image(bad, oci.ImageConfig(architecture="arm64"))}
        )  # fmt: skip
        archive = tmp_path / "ext.tar"
        oci.write_index_archive(archive, index, "t")
        proc = run_check(archive)
        assert proc.returncode == 1
        assert proc.stderr.strip() == 'path "/boot/vmlinuz" is not allowed in extensions'


def umoci_unpack(layout: Path, arch: str, bundle: Path) -> Path:
    """One platform's image, by its `<version>-<arch>` tag (umoci has no platform selection
    and calls the index's own tag ambiguous)."""
    umoci = require_tool("umoci")
    subprocess.run(
        [umoci, "unpack", "--rootless", "--image", f"{layout}:{__version__}-{arch}", str(bundle)],
        check=True,
        capture_output=True,
    )
    return bundle / "rootfs"
