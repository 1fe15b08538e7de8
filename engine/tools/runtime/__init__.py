"""The GPU runtime: a CUDA build of torch fetched from a package index into the user data folder on
first run, and put ahead of the bundled CPU torch at the next start.

  gpu        the NVIDIA driver and GPU, through NVML; which torch CUDA build fits the driver
  index      a package index (PEP 503 HTML or PEP 691 JSON): files, hashes, sizes, metadata
  resolve    torch's requirements, recursively, minus what the app already carries
  download   one wheel: resumable, checked against the index's sha256, cancellable
  install    the runtime folder: disk check, unpack under a temporary name, probe, rename; remove
  activate   at start, before anything imports torch: the runtime's torch, or the bundled one and why

Everything here imports no torch (activate runs before torch is imported), and nothing Qt."""
