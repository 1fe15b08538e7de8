"""A Hugging Face repo id downloads through huggingface_hub — tested against a file server on
loopback that speaks the hub's API, never the network: progress, cache reuse, resume."""
import os
import re

import pytest

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.sources.hub import resolve
from hub_server import HubServer


class Hub(HubServer):
    """One repo, the folder's files plus a pickle file that must never be fetched."""

    def __init__(self, repo_id, folder):
        self.repo_id = repo_id
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
        files["pytorch_model.bin"] = b"pickle that must never be fetched"
        super().__init__({repo_id: files})
        self.files = files


@pytest.fixture
def hub(tiny, tmp_path, monkeypatch):
    h = Hub("acme/tiny-moe", tiny).serve()
    h.kw = dict(endpoint=h.endpoint, cache_dir=tmp_path / "hf-cache")
    yield h
    h.close()


def test_repo_id_downloads_safetensors_only_and_reuses_cache(hub):
    path = resolve("acme/tiny-moe", **hub.kw)
    assert (path / "model.safetensors").is_file() and not (path / "pytorch_model.bin").exists()
    Checkpoint(path).load_tokenizer()
    fetched = {n for m, n, _ in hub.log if m == "GET"}
    assert "model.safetensors" in fetched and "pytorch_model.bin" not in fetched
    n = len([1 for m, *_ in hub.log if m == "GET"])
    assert resolve("acme/tiny-moe", **hub.kw) == path
    assert len([1 for m, *_ in hub.log if m == "GET"]) == n  # nothing fetched again


def test_interrupted_download_resumes(hub):
    # huggingface_hub writes in 10 MiB chunks, so only a file larger than that can resume mid-way
    big = "model-extra.safetensors"
    hub.files[big] = os.urandom(24 * 2**20)
    hub.cut_once = big
    path = resolve("acme/tiny-moe", **hub.kw)
    assert (path / big).read_bytes() == hub.files[big]
    ranges = [r for m, n, r in hub.log if m == "GET" and n == big and r]
    assert ranges and int(re.match(r"bytes=(\d+)-", ranges[0]).group(1)) >= 10 * 2**20  # resumed, not restarted


def test_unknown_repo_is_one_clear_error(hub):
    with pytest.raises(ModelError, match="not found"):
        resolve("acme/nope", **hub.kw)


def test_local_path_is_used_as_is(tiny):
    assert resolve(str(tiny)) == tiny


def test_download_reports_progress_and_can_be_cancelled(hub):
    import threading

    from engine.sources.hub import DownloadCancelled

    seen = []
    path = resolve("acme/tiny-moe", **hub.kw, progress=lambda d, t, w: seen.append((d, t)))
    assert path.is_dir() and seen and seen[-1][0] == seen[-1][1] > 0  # files fetched / files in all
    cancel = threading.Event()
    cancel.set()
    hub.kw["cache_dir"] = hub.kw["cache_dir"].parent / "another-cache"
    with pytest.raises(DownloadCancelled, match="cancelled"):
        resolve("acme/tiny-moe", **hub.kw, cancel=cancel)


def test_one_gguf_file_of_a_repo_downloads_alone(hub, tmp_path):
    """The model browser's choice in a GGUF repo, "owner/name/file.gguf": that file (or all the
    parts of its split set) and nothing else."""
    hub.files["tiny-Q4_0.gguf"] = b"GGUF one"
    hub.files["tiny-Q8_0.gguf"] = b"GGUF other"
    hub.files["big-00001-of-00002.gguf"] = b"GGUF part one"
    hub.files["big-00002-of-00002.gguf"] = b"GGUF part two"
    path = resolve("acme/tiny-moe/tiny-Q4_0.gguf", **hub.kw)
    assert path.name == "tiny-Q4_0.gguf" and path.read_bytes() == b"GGUF one"
    assert {n for m, n, _ in hub.log if m == "GET"} == {"tiny-Q4_0.gguf"}
    first = resolve("acme/tiny-moe/big-00001-of-00002.gguf", **hub.kw)
    assert (first.parent / "big-00002-of-00002.gguf").read_bytes() == b"GGUF part two"
    assert "tiny-Q8_0.gguf" not in hub.fetched() and "model.safetensors" not in hub.fetched()


def test_the_endpoint_is_read_from_hf_endpoint_when_called(hub, monkeypatch):
    """HF_ENDPOINT set after huggingface_hub was imported still reaches the download (the window's
    download and the model browser's search use the same address)."""
    import huggingface_hub  # noqa: F401 (imported first: its constants were read before the variable is set)

    from engine.sources.hub import hub_endpoint

    monkeypatch.setenv("HF_ENDPOINT", hub.kw["endpoint"])
    assert hub_endpoint() == hub.kw["endpoint"]
    path = resolve("acme/tiny-moe", cache_dir=hub.kw["cache_dir"])
    assert (path / "model.safetensors").is_file()
