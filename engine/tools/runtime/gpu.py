"""The NVIDIA driver and GPU, read through NVML, and which torch CUDA build the driver can run.

NVML ships with the driver, so it answers whether or not a CUDA torch is installed: that is how a
CPU-only install knows the machine has a GPU worth a download."""
from __future__ import annotations

from dataclasses import dataclass

# torch's CUDA builds and the CUDA version each needs from the driver, newest first. The driver
# reports the newest CUDA it supports (nvmlSystemGetCudaDriverVersion); a build needs at least its
# own major.minor (CUDA minor-version compatibility holds within a major, but the build's PTX and
# libraries are only promised from that version on). Update this list with torch's release matrix.
CUDA_BUILDS = (((13, 0), "cu130"), ((12, 8), "cu128"), ((12, 6), "cu126"))
INDEX_URL = "https://download.pytorch.org/whl/{tag}"


@dataclass(frozen=True)
class NvidiaGpu:
    name: str
    vram_bytes: int
    driver: str                 # e.g. "580.65.06"
    cuda: tuple[int, int]       # the newest CUDA the driver supports, e.g. (13, 0)
    count: int = 1

    def describe(self) -> str:
        more = f" (+{self.count - 1} more)" if self.count > 1 else ""
        return (f"NVIDIA {self.name.removeprefix('NVIDIA ')}, {self.vram_bytes / 2**30:.0f} GB{more}; "
                f"driver {self.driver}, CUDA {self.cuda[0]}.{self.cuda[1]}")


def find_nvidia() -> tuple[NvidiaGpu | None, str]:
    """(the first NVIDIA GPU, "") or (None, why not) — never raises."""
    try:
        import pynvml
    except ImportError:
        return None, "no NVIDIA GPU (the NVML binding, nvidia-ml-py, is not installed)"
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound: no driver; DriverNotLoaded; ...
        return None, f"no NVIDIA GPU (no NVIDIA driver: {e})"
    try:
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            return None, "no NVIDIA GPU (the driver is loaded but reports no device)"
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        v = int(pynvml.nvmlSystemGetCudaDriverVersion_v2())  # e.g. 12040 for 12.4
        total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        return NvidiaGpu(name, total, driver, (v // 1000, (v % 1000) // 10), count), ""
    except Exception as e:
        return None, f"no usable NVIDIA GPU (NVML: {type(e).__name__}: {e})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def cuda_build(gpu: NvidiaGpu) -> tuple[str | None, str]:
    """(the build tag, e.g. "cu128", "") for this driver, or (None, what to do)."""
    for need, tag in CUDA_BUILDS:
        if gpu.cuda >= need:
            return tag, ""
    oldest = CUDA_BUILDS[-1][0]
    return None, (f"the NVIDIA driver {gpu.driver} supports CUDA {gpu.cuda[0]}.{gpu.cuda[1]}, and torch's CUDA "
                  f"builds need {oldest[0]}.{oldest[1]} or newer: update the NVIDIA driver")


def default_index(gpu: NvidiaGpu | None) -> tuple[str | None, str]:
    """(index URL of the torch build that fits this GPU's driver, "") or (None, why none).
    MIXDESK_RUNTIME_INDEX_URL overrides it (a mirror, or a company's package proxy)."""
    import os

    if os.environ.get("MIXDESK_RUNTIME_INDEX_URL"):
        return os.environ["MIXDESK_RUNTIME_INDEX_URL"], ""
    if gpu is None:
        return None, "no NVIDIA GPU found: give --index-url to fetch a runtime anyway"
    tag, why = cuda_build(gpu)
    return (INDEX_URL.format(tag=tag), "") if tag else (None, why)
