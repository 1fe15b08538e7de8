"""The GPU runtime (engine/tools/runtime): fetched from a package index served on loopback, with
stand-in wheels written here plus one real wheel from this machine's local package cache."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from engine.tools.runtime import activate as act
from engine.tools.runtime.download import ChecksumMismatch
from engine.tools.runtime.gpu import NvidiaGpu, cuda_build, default_index
from engine.tools.runtime.index import Index, RuntimeProblem
from engine.tools.runtime.install import downloads_dir, install, prepare
from engine.tools.runtime.resolve import resolve
from pkgindex import PackageIndex, make_wheel

MIXDESK = [sys.executable, "-c", "import sys; from app.entry import main; sys.exit(main())"]
LOCAL_WHEEL_DIRS = [Path("/opt/pypi/files"), Path("/opt/wheels"), Path("/opt/pypi-more/files"),
                    Path.home() / ".cache" / "pip" / "wheels"]

from runtime_helpers import STANDIN_TORCH  # noqa: E402,F401 (shared: tests/runtime_helpers.py)


def real_wheel(name: str, tmp: Path) -> Path:
    """A real wheel of `name` from the local package cache (this machine kind keeps pip's on disk)."""
    for d in LOCAL_WHEEL_DIRS:
        found = sorted(d.rglob(f"{name}-*.whl")) if d.exists() else []
        if found:
            return found[-1]
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp), name.replace("_", "-")],
                       capture_output=True, timeout=120)
    found = sorted(tmp.glob(f"{name}-*.whl"))
    if r.returncode or not found:
        pytest.skip(f"no real {name} wheel in the local package cache, and pip could not fetch one")
    return found[-1]


@pytest.fixture
def rt(tmp_path, monkeypatch):
    """A private runtime folder (MIXDESK_RUNTIME_DIR) for this test and its child processes."""
    root = tmp_path / "runtime"
    monkeypatch.setenv("MIXDESK_RUNTIME_DIR", str(root))
    return root


@pytest.fixture
def index(tmp_path):
    """Stand-in torch needing: a real wheel (tomli-w), a stand-in with an extra, one requirement the app
    already carries (packaging), and one whose marker does not apply here."""
    w = tmp_path / "wheels"
    w.mkdir()
    wheels = [
        make_wheel(w, "torch", "2.13.0", requires=[
            "tomli-w>=1.0", "mdk-kernels[fast]>=1; platform_system == 'Linux' or platform_system == 'Windows'",
            "packaging>=20", "mdk-windows-only; sys_platform == 'nothing-here'", "mdk-optional; extra == 'opt'"],
            files=STANDIN_TORCH, extras=["opt"]),
        make_wheel(w, "torch", "2.12.0", files=STANDIN_TORCH),
        make_wheel(w, "mdk-kernels", "1.0", requires=["mdk-fast-path==2.*; extra == 'fast'"], extras=["fast"],
                   files={"mdk_kernels/__init__.py": "NAME = 'kernels'\n"}),
        make_wheel(w, "mdk-kernels", "3.0rc1", files={"mdk_kernels/__init__.py": "NAME = 'pre'\n"}),
        make_wheel(w, "mdk-fast-path", "2.1", files={"mdk_fast_path/__init__.py": "X = 1\n",
                                                      "mdk_fast_path/blob.bin": os.urandom(3 << 20).hex()}),
        make_wheel(w, "mdk-fast-path", "3.0", files={"mdk_fast_path/__init__.py": "X = 3\n"}),
        real_wheel("tomli_w", tmp_path),
    ]
    ix = PackageIndex(wheels=wheels).start()
    yield ix
    ix.stop()


def run(args, env=None, timeout=300):
    return subprocess.run(MIXDESK + args, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=Path(__file__).resolve().parents[1])


def test_cuda_build_follows_the_driver():
    gpu = lambda cuda: NvidiaGpu("NVIDIA GeForce RTX 4090", 24 << 30, "570.1", cuda)  # noqa: E731
    assert cuda_build(gpu((13, 1)))[0] == "cu130"
    assert cuda_build(gpu((12, 9)))[0] == "cu128"
    assert cuda_build(gpu((12, 6)))[0] == "cu126"
    tag, why = cuda_build(gpu((12, 4)))
    assert tag is None and "update the NVIDIA driver" in why and "12.4" in why
    assert default_index(gpu((12, 8)))[0].endswith("/whl/cu128")
    assert default_index(None)[0] is None
    assert "RTX 4090, 24 GB" in gpu((13, 0)).describe()


def test_resolve_takes_markers_extras_and_what_the_app_carries(index):
    plan = resolve(Index(index.url), Requirement("torch==2.13.0"))
    got = {d.name: str(d.version) for d in plan.wheels}
    # newest fitting versions; no pre-release; the extra's requirement; markers that do not apply skipped
    assert got == {"torch": "2.13.0", "tomli-w": got["tomli-w"], "mdk-kernels": "1.0", "mdk-fast-path": "2.1"}
    assert plan.wheels[0].name == "torch" and all(d.sha256 and d.size for d in plan.wheels)
    assert any(c.startswith("packaging ") for c in plan.carried)
    with pytest.raises(RuntimeProblem, match=r"no wheel of torch==9\.9"):
        resolve(Index(index.url), Requirement("torch==9.9"))


def test_fetch_with_progress_then_the_runtime_is_used(index, rt):
    offer = prepare(index.url, "2.13.0")
    assert offer.already == 0 and "torch 2.13.0 and 3 more wheels" in offer.describe()
    seen = []
    doc = install(offer, lambda done, total, what: seen.append((done, total, what)))
    downloads = [s for s in seen if not s[2].startswith("unpacked ")]
    assert [d for d, _, _ in downloads] == sorted(d for d, _, _ in downloads)  # it only grows
    assert downloads[-1][:2] == (offer.download_bytes, offer.download_bytes) and len(downloads) >= 5
    folder = Path(doc["folder"])
    assert json.loads((rt / "active.json").read_text())["folder"] == folder.name
    site = folder / "site"
    assert (site / "torch" / "__init__.py").exists() and (site / "tomli_w").is_dir()
    assert doc["probe"]["version"] == "2.13.0+cu999" and doc["probe"]["cuda_build"] == "99.9"
    assert not downloads_dir().exists() and not list(rt.glob(".staging-*"))  # GBs given back, nothing half-done
    # the next start puts it first: the real wheel imports from the runtime, in a child process
    code = ("from engine.tools.runtime.activate import activate; a = activate(); import torch, tomli_w; "
            "print(a.state, torch.__version__, tomli_w.__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ,
                         cwd=Path(__file__).resolve().parents[1])
    state, version, where = out.stdout.split()
    assert (state, version) == ("active", "2.13.0+cu999") and where.startswith(str(site)), out.stderr


def test_an_interrupted_fetch_resumes(index, rt):
    index.pep658 = False  # metadata read from the wheels' zip directories by range requests
    offer = prepare(index.url, "2.13.0")
    big = next(d for d in offer.plan.wheels if d.name == "mdk-fast-path")
    index.cut_after[big.filename] = 1 << 20
    with pytest.raises(RuntimeProblem, match="stopped at .* run the install again to resume"):
        install(offer)
    part = downloads_dir() / (big.filename + ".part")
    assert part.stat().st_size == 1 << 20 and not (rt / "active.json").exists()
    index.requests.clear()
    again = prepare(index.url, "2.13.0")
    assert again.already >= 1 << 20 and "already here" in again.describe()
    doc = install(again)
    whole = [r for m, p, r in index.requests if m == "GET" and p.endswith(big.filename) and not r[-1:].isdigit()]
    assert whole == [f"bytes={1 << 20}-"]  # the download asked only for the rest
    assert (Path(doc["folder"]) / "site" / "mdk_fast_path" / "blob.bin").stat().st_size == 6 << 20


def test_a_wrong_checksum_is_refused_and_nothing_is_left(index, rt):
    offer = prepare(index.url, "2.13.0")
    index.wrong_sha.add(next(d.filename for d in offer.plan.wheels if d.name == "mdk-kernels"))
    with pytest.raises(ChecksumMismatch, match="does not match the index's .* nothing was installed"):
        install(prepare(index.url, "2.13.0"))
    assert not downloads_dir().exists()
    assert not rt.exists() or not any(rt.iterdir())


def test_a_full_disk_is_refused_before_any_download(index, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        index.requests.clear()
        r = run(["runtime", "install", "--index-url", index.url, "--torch-version", "2.13.0"],
                env={"MIXDESK_RUNTIME_DIR": str(small / "runtime")})
        assert r.returncode == 2 and "Traceback" not in r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("mixdesk: not enough free disk") and "nothing was downloaded" in line, line
        assert not [p for m, p, _ in index.requests if m == "GET" and p.endswith(".whl")]
        assert not any(small.iterdir())
    finally:
        subprocess.run(["umount", str(small)])


def test_offline_is_one_line_and_the_app_goes_on(tiny, rt):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there: connection refused, as offline
    r = run(["runtime", "install", "--index-url", f"http://127.0.0.1:{port}/simple"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"cannot reach 127.0.0.1:{port}: connection refused" in r.stderr.strip().splitlines()[-1]
    assert not rt.exists()
    r = run(["chat", "--model", str(tiny), "--prompt", "hello", "--max-new-tokens", "4", "--dtype", "fp32", "--quiet"])
    assert r.returncode == 0, r.stderr
    r = run(["runtime", "status", "--index-url", f"http://127.0.0.1:{port}/simple"])
    assert r.returncode == 0 and "an install cannot be planned now: cannot reach" in r.stdout


def test_a_runtime_that_fails_to_import_falls_back_at_start(index, rt):
    install(prepare(index.url, "2.13.0"))
    init = act.active_folder(rt) / "site" / "torch" / "__init__.py"
    init.write_text("raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    r = run(["--self-test"])
    assert r.returncode == 0, r.stderr
    assert "its torch failed to import (ImportError: libcudart.so.13: cannot open shared object file)" in r.stderr
    assert "running on the bundled torch" in r.stderr
    assert "from this Python environment" in r.stdout and "self-test passed" in r.stdout
    # a crash inside the runtime's libraries (no exception to catch): that start dies, the next one falls back
    init.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert run(["runtime", "status"]).returncode != 0
    r = run(["runtime", "status"])
    assert r.returncode == 0 and "died while importing its torch" in r.stdout, r.stdout + r.stderr
    assert "from this Python environment" in r.stdout


def test_a_runtime_torch_the_engine_cannot_run_on_is_set_aside_and_the_start_goes_on(index, rt):
    """Its torch imports and adds 1 + 1 (the stand-in does), but Mixdesk's engine fails to import on it:
    the start sets it aside and starts again on the bundled torch; later starts go straight there."""
    install(prepare(index.url, "2.13.0"))
    r = run(["runtime", "status"])
    assert r.returncode == 0, r.stderr
    assert "Mixdesk's engine does not import on its torch" in r.stderr and "from this Python environment" in r.stdout
    assert "set-aside.json" in {p.name for p in act.active_folder(rt).iterdir()}
    r = run(["runtime", "status"])
    assert r.returncode == 0 and "note: the GPU runtime in" in r.stdout and "engine does not import" in r.stdout


def test_an_install_whose_torch_does_not_import_installs_nothing(tmp_path, rt):
    bad = make_wheel(tmp_path, "torch", "2.13.0", files={"torch/__init__.py": "raise OSError('libtorch_cuda.so: bad ELF')\n"})
    ix = PackageIndex(wheels=[bad]).start()
    try:
        with pytest.raises(RuntimeProblem, match="does not import here .*OSError: libtorch_cuda.so: bad ELF.*nothing was installed"):
            install(prepare(ix.url, "2.13.0"))
    finally:
        ix.stop()
    assert not (rt / "active.json").exists() and not list(rt.glob(".staging-*"))


def test_an_unsafe_wheel_path_is_refused(tmp_path, rt):
    evil = make_wheel(tmp_path, "torch", "2.13.0", files={"../../escape.py": "x = 1\n", **STANDIN_TORCH})
    ix = PackageIndex(wheels=[evil]).start()
    try:
        with pytest.raises(RuntimeProblem, match="refusing the unsafe path '../../escape.py'"):
            install(prepare(ix.url, "2.13.0"))
    finally:
        ix.stop()
    assert not list(tmp_path.rglob("escape.py")) and not (rt / "active.json").exists()


@pytest.mark.slow  # 20 s: a real wheel built and imported; the other runtime tests use small ones
def test_a_real_torch_wheel_is_used_from_the_next_start_and_remove_cleans_up(tmp_path, rt):
    """The local package cache's real torch wheel as a runtime (its requirements are all carried by
    this environment): fetched, unpacked, probed; the next start runs on it; `remove` cleans up."""
    import torch

    local = sorted(Path("/opt/wheels").glob("torch-*.whl")) if Path("/opt/wheels").exists() else []
    if not local:
        pytest.skip("no torch wheel in the local package cache (/opt/wheels)")
    ix = PackageIndex(wheels=[local[-1]]).start()
    try:
        version = local[-1].name.split("-")[1]
        offer = prepare(ix.url, version.split("+")[0])
        assert [d.filename for d in offer.plan.wheels] == [local[-1].name]
        seen = []
        doc = install(offer, lambda done, total, what: seen.append(done) if not what.startswith("unpacked") else None)
    finally:
        ix.stop()
    assert seen[-1] == local[-1].stat().st_size and len(seen) > 100
    site = Path(doc["folder"]) / "site"
    probed = doc["probe"]["file"]  # imported in a child while the folder still had its temporary name
    assert doc["probe"]["version"] == version and probed.startswith(str(rt)) and probed.endswith("site/torch/__init__.py")
    r = run(["runtime", "status"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"torch {version} (CPU build) from the GPU runtime: {site / 'torch'}"), r.stdout
    assert str(Path(torch.__file__).parent) not in r.stdout
    downloads_dir().mkdir(parents=True)
    (downloads_dir() / "left.whl.part").write_bytes(b"x" * 1000)  # a download interrupted since
    r = run(["runtime", "remove"])
    assert r.returncode == 0 and "removed the GPU runtime (0.7 GB freed)" in r.stdout, r.stdout + r.stderr
    assert not rt.exists() and not downloads_dir().exists()
    r = run(["runtime", "status"])
    assert r.returncode == 0 and "GPU runtime: none installed" in r.stdout
    assert f"from this Python environment: {Path(torch.__file__).parent}" in r.stdout
    assert run(["runtime", "remove"]).stdout.startswith("no GPU runtime installed")


def test_runtime_status_says_what_torch_and_gpu(rt):
    import torch

    r = run(["runtime", "status"])
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"torch {torch.__version__} (") and str(Path(torch.__file__).parent) in first
    assert "GPU: no NVIDIA GPU" in r.stdout  # this machine kind has no NVIDIA driver
    assert "GPU runtime: none installed" in r.stdout


@pytest.mark.slow
def test_a_real_cuda_torch_as_runtime_runs_the_self_test(tmp_path, rt):
    """A real CUDA build of torch (a different version from this environment's) and its ~20 CUDA
    wheels, from the local package cache through a loopback index: `mixdesk --self-test` runs on it."""
    import torch

    mirrors = [p for p in (Path("/opt/pypi-more/simple"), Path("/opt/pypi/simple")) if p.exists()]
    cuda_torch = sorted(Path("/opt/pypi-more/files").glob("torch-2.14.1-*.whl")) if mirrors else []
    if not cuda_torch:
        pytest.skip("no CUDA torch wheel in the local package cache")
    extra = tmp_path / "extra"  # the one requirement the local cache lacks comes from the package registry
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(extra),
                        "cuda-bindings>=13.0.3,<14"], capture_output=True, text=True, timeout=300)
    if r.returncode:
        pytest.skip(f"cuda-bindings could not be fetched: {r.stderr.strip()[-200:]}")
    ix = PackageIndex(wheels=[*cuda_torch, *extra.glob("*.whl")], mirrors=mirrors).start()
    try:
        r = run(["runtime", "install", "--index-url", ix.url, "--torch-version", "2.14.1"], timeout=1800)
    finally:
        ix.stop()
    assert r.returncode == 0, r.stderr[-2000:]
    assert "installed torch 2.14.1" in r.stdout and "GB to download" in r.stderr
    r = run(["--self-test"], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("torch 2.14.1+cu") and " build) from the GPU runtime: " + str(rt) in first, first
    assert torch.__version__ not in first and "self-test passed" in r.stdout


def test_an_nvidia_machine_on_a_cpu_torch_is_told_how_to_fix_it(monkeypatch, capsys, rt, tmp_path, window_cache):
    import engine.tools.runtime.gpu as gpu_mod
    import engine.tools.runtime.install as install_mod
    from app.self_test import run as self_test

    rtx = NvidiaGpu("NVIDIA GeForce RTX 3090", 24 << 30, "575.51", (12, 9))
    monkeypatch.setattr(gpu_mod, "find_nvidia", lambda: (rtx, ""))
    monkeypatch.setattr(install_mod, "find_nvidia", lambda: (rtx, ""))
    monkeypatch.delenv("MIXDESK_RUNTIME_INDEX_URL", raising=False)
    assert self_test() == 0  # in window_cache: the machine measured once per run
    tip = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("tip: "))
    assert "CPU build but NVIDIA GeForce RTX 3090, 24 GB" in tip
    version = __import__("torch").__version__.split("+")[0]
    assert f"pip install --force-reinstall torch=={version} --index-url https://download.pytorch.org/whl/cu128" in tip
    assert "`mixdesk runtime install`" in tip


def test_cancel_keeps_what_was_downloaded_and_installs_nothing(index, rt):
    import threading

    from engine.tools.runtime.download import Cancelled

    offer = prepare(index.url, "2.13.0")
    cancel = threading.Event()
    seen = []

    def progress(done, total, what):
        seen.append(done)
        if done > 1 << 20:  # the user presses Cancel during the big wheel
            cancel.set()
    with pytest.raises(Cancelled, match="kept to resume"):
        install(offer, progress, cancel)
    assert not (rt / "active.json").exists() and not list(rt.glob(".staging-*"))
    kept = sum(p.stat().st_size for p in downloads_dir().iterdir())
    assert kept > 1 << 20 and prepare(index.url, "2.13.0").already > 0  # an install resumes from here
