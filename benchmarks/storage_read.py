"""Sequential read throughput of a btrfs RAID0 data mount against one of its member drives.

Builds what the storage role builds with the btrfs backend (data raid0, metadata raid1, mounted
noatime, read_ahead_kb set on the members) over two loop devices backed by sparse files on this
host, writes one large file on the mount, then reads, N times each and alternating: the file on the
mount, and the same number of bytes from one member device, with the same tool (fio where installed,
else dd) and the same parameters. Page caches are dropped before every read where
/proc/sys/vm/drop_caches is writable; the loop devices use direct I/O to their backing files so
the host's page cache of the image files does not serve the reads. Prints every run and the medians;
asserts nothing. Cleans up everything it made (mount, loop devices, files), also on errors.

Both members live on this host's one disk, so RAID0 cannot add bandwidth here: the figure shows the
overhead (or not) of the btrfs RAID0 layer over the same disk. On a server with two NVMe drives on
separate lanes the same comparison shows the striping gain: two CPU-attached drives
in RAID0 should read at least 1.8x one drive (docs/tuning.md, 'Layout', on where drives hang).

Usage: python benchmarks/storage_read.py [--runs 5] [--warmup 1] [--size-mib 2048] [--dir /var/tmp] [--tool auto|fio|dd]
Needs root, losetup and mkfs.btrfs (apt-get install btrfs-progs; fio optional).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

READ_AHEAD_KB = 4096  # the role's default (storage_read_ahead_kb)


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True, **kwargs)


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def read_fio(path: str, size: int) -> float:
    out = run("fio", "--name=seqread", f"--filename={path}", "--rw=read", "--bs=1M", f"--size={size}",
              "--ioengine=psync", "--direct=0", "--readonly", "--invalidate=1", "--output-format=json").stdout
    job = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return job["bw_bytes"] / 1e6


def read_dd(path: str, size: int) -> float:
    count = size // (1 << 20)
    start = time.perf_counter()
    run("dd", f"if={path}", "of=/dev/null", "bs=1M", f"count={count}", "status=none")
    return count * (1 << 20) / (time.perf_counter() - start) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size-mib", type=int, default=2048, help="size of the file read from the mount")
    parser.add_argument("--dir", default="/var/tmp", help="where the drive images go (a real disk, not tmpfs)")
    parser.add_argument("--tool", choices=("auto", "fio", "dd"), default="auto")
    parser.add_argument("--warmup", type=int, default=1, help="discarded rounds before the measured ones")
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = parser.parse_args(argv)

    if os.geteuid() != 0:
        print("skipped: needs root (losetup, mount)", file=sys.stderr)
        return 2
    missing = [t for t in ("losetup", "mkfs.btrfs", "mount", "umount", "blockdev") if shutil.which(t) is None]
    if missing:
        print(f"skipped: {', '.join(missing)} missing (apt-get install btrfs-progs)", file=sys.stderr)
        return 2
    tool = args.tool if args.tool != "auto" else ("fio" if shutil.which("fio") else "dd")
    read = read_fio if tool == "fio" else read_dd
    size = args.size_mib << 20

    work = Path(tempfile.mkdtemp(prefix="storage-read-", dir=args.dir))
    images = [work / "member-a.img", work / "member-b.img"]
    mountpoint = work / "data"
    loops: list[str] = []
    mounted = False
    try:
        for image in images:
            # Written out, not sparse: a hole in the image would read as zeros without any disk I/O.
            run("dd", "if=/dev/zero", f"of={image}", "bs=1M", f"count={args.size_mib + 1024}", "conv=fsync",
                "status=none")
            loops.append(run("losetup", "--find", "--show", "--direct-io=on", str(image)).stdout.strip())
        fsid = str(uuid.uuid4())
        run("mkfs.btrfs", "-q", "-U", fsid, "-L", "bench", "-d", "raid0", "-m", "raid1", *loops)
        mountpoint.mkdir()
        run("mount", "-o", "noatime," + ",".join(f"device={loop}" for loop in loops), loops[0], str(mountpoint))
        mounted = True
        for loop in loops:  # as the role's udev rule does for btrfs members
            run("blockdev", "--setra", str(READ_AHEAD_KB * 2), loop)
        data = mountpoint / "big.bin"
        run("dd", "if=/dev/zero", f"of={data}", "bs=1M", f"count={args.size_mib}", "conv=fsync", "status=none")
        profile = run("btrfs", "filesystem", "df", str(mountpoint)).stdout.splitlines()[0]

        dropped = drop_caches()
        print(f"tool {tool}, {args.size_mib} MiB sequential reads, bs 1M, buffered, read_ahead_kb {READ_AHEAD_KB}, "
              f"caches {'dropped before each read' if dropped else 'NOT dropped (no permission)'}; {profile}")
        results: dict[str, list[float]] = {"mount": [], "member": []}
        for _ in range(args.warmup):  # discarded: the first reads also warm the host's own disk caches
            for path in (str(data), loops[0]):
                drop_caches()
                read(path, size)
        for number in range(1, args.runs + 1):
            for what, path in (("mount", str(data)), ("member", loops[0])):
                drop_caches()
                results[what].append(read(path, size))
            print(f"run {number}: mount {results['mount'][-1]:8.1f} MB/s   member {loops[0]} "
                  f"{results['member'][-1]:8.1f} MB/s")
        med_mount, med_member = statistics.median(results["mount"]), statistics.median(results["member"])
        print(f"median over {args.runs} runs: data mount (btrfs raid0 over 2 loop drives) {med_mount:.1f} MB/s "
              f"(min {min(results['mount']):.1f}, max {max(results['mount']):.1f}), one member drive {med_member:.1f} "
              f"MB/s (min {min(results['member']):.1f}, max {max(results['member']):.1f}), "
              f"ratio {med_mount / med_member:.2f}")
        if args.json:
            print(json.dumps({"tool": tool, "size_mib": args.size_mib, "runs": args.runs, "caches_dropped": dropped,
                              "mount_mb_s": results["mount"], "member_mb_s": results["member"],
                              "median_mount_mb_s": med_mount, "median_member_mb_s": med_member}))
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], check=False)
        if shutil.which("btrfs"):
            for loop in loops:  # drop the kernel's registration of this filesystem's devices
                subprocess.run(["btrfs", "device", "scan", "--forget", loop], check=False, capture_output=True)
        for loop, image in zip(loops, images, strict=False):  # fewer loops where a losetup failed
            back = subprocess.run(["losetup", "--noheadings", "--output", "BACK-FILE", loop],
                                  capture_output=True, text=True).stdout.strip()
            if back == str(image):
                subprocess.run(["losetup", "--detach", loop], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
