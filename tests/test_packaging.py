"""The Linux bundle: built from the checkout, it passes its self-test offline (in a network
namespace with no interfaces) and writes nothing into its own folder. Slow: minutes of build."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("dpkg-deb") is None,
                    reason="Linux with dpkg-deb")
def test_build_linux_bundle_and_self_test(tmp_path):
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "packaging/build_linux.sh"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(r.stdout[-500:])
    bundle = ROOT / "build" / "linux" / "dist" / "mixdesk"
    debs = list((ROOT / "build" / "linux").glob("mixdesk_*_amd64.deb"))
    assert (bundle / "mixdesk").is_file() and debs
    before = snapshot(bundle)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen",
           "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    cmd = [str(bundle / "mixdesk"), "--self-test"]
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"]).returncode == 0:
        cmd = ["unshare", "-n"] + cmd  # no network at all
    s = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    print(s.stdout)
    assert s.returncode == 0, s.stdout[-2000:] + s.stderr[-2000:]
    assert "CUDA not available" in s.stdout and "NVML absent" in s.stdout and "CPU-only" in s.stdout
    assert "CPU expert kernel: native" in s.stdout  # the bundle carries the built library
    assert snapshot(bundle) == before  # nothing written into the install folder
    # no display at all (no DISPLAY, WAYLAND_DISPLAY or QT_QPA_PLATFORM): the self-test still runs
    bare = {k: v for k, v in env.items() if k != "QT_QPA_PLATFORM"}
    s = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=bare)
    assert s.returncode == 0 and "self-test passed" in s.stdout, s.stdout[-2000:] + s.stderr[-2000:]
    assert "platform offscreen" in s.stdout
    # with a loopback interface, the bundled server stack answers (mixdesk serve, Local server)
    s = subprocess.run([str(bundle / "mixdesk"), "--self-test"], capture_output=True, text=True, timeout=600, env=bare)
    assert s.returncode == 0 and "local server answered" in s.stdout, s.stdout[-2000:] + s.stderr[-2000:]
    r = subprocess.run([str(bundle / "mixdesk"), "runtime", "status"], capture_output=True, text=True, env=bare)
    assert r.returncode == 0 and "from the app's bundle" in r.stdout and "GPU: no NVIDIA GPU" in r.stdout, r.stdout
    _bundle_runs_on_a_fetched_runtime(bundle, bare, cmd)
    assert snapshot(bundle) == before
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    print(f"bundle {size / 2**30:.2f} GiB, deb {debs[0].stat().st_size / 2**30:.2f} GiB, "
          f"build + check {time.perf_counter() - t0:.0f} s")


def _bundle_runs_on_a_fetched_runtime(bundle: Path, env: dict, self_test: list) -> None:
    """The frozen app fetches the local package cache's torch wheel as its runtime (its child probe is
    the bundle itself), runs its self-test on it offline, and falls back when that runtime breaks."""
    sys.path.insert(0, str(Path(__file__).parent))
    from pkgindex import PackageIndex

    local = sorted(Path("/opt/wheels").glob("torch-*.whl"))
    if not local:
        print("no torch wheel in the local package cache: the bundle's runtime check is skipped")
        return
    ix = PackageIndex(wheels=[local[-1]]).start()
    try:
        r = subprocess.run([str(bundle / "mixdesk"), "runtime", "install", "--index-url", ix.url], capture_output=True,
                           text=True, timeout=900, env=env)
    finally:
        ix.stop()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    runtime = Path(env["XDG_DATA_HOME"]) / "mixdesk" / "runtime"
    s = subprocess.run(self_test, capture_output=True, text=True, timeout=600, env=env)
    print(s.stdout)
    assert s.returncode == 0, s.stdout[-2000:] + s.stderr[-2000:]
    assert f"from the GPU runtime: {runtime}" in s.stdout.splitlines()[0]
    init = next(runtime.glob("torch-*/site/torch/__init__.py"))
    init.write_text("raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    s = subprocess.run(self_test, capture_output=True, text=True, timeout=600, env=env)
    assert s.returncode == 0 and "from the bundle" in s.stdout.splitlines()[0], s.stdout[-2000:] + s.stderr[-2000:]
    assert "its torch failed to import (ImportError: libcudart.so.13" in s.stderr
    r = subprocess.run([str(bundle / "mixdesk"), "runtime", "remove"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and not runtime.exists()
