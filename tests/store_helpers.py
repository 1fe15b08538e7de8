"""Shared by several test modules (moved out of tests/test_store.py, which uses them too): fill, small_disk."""
import errno
import shutil
import subprocess
import sys
from pathlib import Path
import pytest


DISK_K = 512


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK_K KB, unmounted afterwards (stores on it must be closed first)."""
    if not sys.platform.startswith("linux") or not shutil.which("mount"):
        pytest.skip("needs Linux's mount to make a small disk that fills up")
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_K}k,mode=0700", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs to fill ({r.stderr.strip() or 'mount failed'}): needs root")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)  # never leave a mount behind


def fill(disk: Path) -> Path:
    """Take every free byte of the disk; the file to remove to free it."""
    filler = disk / "filler"
    with open(filler, "ab", buffering=0) as f:
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return filler

