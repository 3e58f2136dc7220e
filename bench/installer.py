"""install-cni's time against the number of CNI configs (issue 30 item 6): `--once` then
`--uninstall` of N `.conf` files of 1 KB (each converted to a `.conflist`), on tmpfs
(Talos' /etc/cni) and on /var/tmp (the disk: ext4 here, the repo's too).

Each (directory, N) runs in a fresh interpreter, the applet in-process (source mode: the
binary runs the same Python); wall and CPU seconds of the process are reported (CPU as
user+sys, and the kernel's share of it: on ext4 most of it, in inode allocation and
freeing, see docs/benchmarks.md), and every
config is checked patched after the install and byte-identical after the uninstall.
Nothing outside the temporary directory is touched. Speed is reported here, never
asserted in tests (tests/pure/test_install_cni_never_loses.py asserts the flush count).

    python bench/installer.py [--counts 200,1000,10000] [--dirs /dev/shm,/var/tmp]
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one(count: int, base: str) -> dict[str, object]:
    """The child: one install and uninstall of `count` configs under `base`."""
    sys.path.insert(0, str(REPO))
    from multicall.applets import install_cni
    from tests.support.installer_host import TESTDATA, linkerd_count, make_host

    conf = (TESTDATA / "10-calico.conf").read_bytes()
    root = Path(tempfile.mkdtemp(prefix="bench-installer-", dir=base))
    try:
        host = make_host(root)
        for i in range(count):
            (host.net_dir / f"{i:05d}.conf").write_bytes(conf)
        env = host.env()
        times = {}
        for mode in ("--once", "--uninstall"):
            err = io.BytesIO()
            wall, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
            code = install_cni.main(["install-cni", mode], env, io.BytesIO(), err, err)
            after = resource.getrusage(resource.RUSAGE_SELF)
            kernel = after.ru_stime - before.ru_stime
            cpu = after.ru_utime - before.ru_utime + kernel
            times[mode] = (time.monotonic() - wall, cpu, kernel)
            if code != 0:
                raise SystemExit(f"{mode} failed: {err.getvalue()[-500:]!r}")
            if mode == "--once":
                sample = host.net_dir / f"{count - 1:05d}.conflist"
                assert linkerd_count(sample) == 1
        names = sorted(p.name for p in host.net_dir.iterdir() if p.is_file())
        assert names == [f"{i:05d}.conf" for i in range(count)]
        assert all((host.net_dir / n).read_bytes() == conf for n in names)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "configs": count,
        "dir": base,
        "install_s": round(times["--once"][0], 2),
        "install_cpu_s": round(times["--once"][1], 2),
        "install_sys_s": round(times["--once"][2], 2),
        "uninstall_s": round(times["--uninstall"][0], 2),
        "uninstall_cpu_s": round(times["--uninstall"][1], 2),
        "uninstall_sys_s": round(times["--uninstall"][2], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="200,1000,10000")
    parser.add_argument("--dirs", default="/dev/shm,/var/tmp")
    parser.add_argument("--one", nargs=2, metavar=("N", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1])))
        return
    head = ("dir", "configs", "install s", "(cpu)", "(sys)", "uninstall s", "(cpu)", "(sys)")
    print("{:<24} {:>7} {:>10} {:>7} {:>7} {:>12} {:>7} {:>7}".format(*head))
    for base in args.dirs.split(","):
        for count in (int(c) for c in args.counts.split(",")):
            out = subprocess.run(
                [sys.executable, __file__, "--one", str(count), base],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            row = json.loads(out)
            print(
                f"{base:<24} {count:>7} {row['install_s']:>10} {row['install_cpu_s']:>7} "
                f"{row['install_sys_s']:>7} {row['uninstall_s']:>12} "
                f"{row['uninstall_cpu_s']:>7} {row['uninstall_sys_s']:>7}",
                flush=True,
            )


if __name__ == "__main__":
    main()
