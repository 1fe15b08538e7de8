"""A model folder's files are read only from inside it: an entry that is a link leading out of the
folder (the chat template, the tokenizer's files, the configs) is refused, before anything reads
it, with one error naming the file. A Hugging Face cache snapshot, whose files all link into the
repository's blob store, still loads.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from engine.files.checkpoint import Checkpoint
from engine.protocol.errors import ModelError
from engine.runtime.load import open_checkpoint


@pytest.fixture
def model(tiny, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(tiny, dst)
    return dst


def link_out(folder: Path, name: str, outside: Path) -> Path:
    """folder/name becomes a link to a copy of it outside the folder (or to `outside` itself)."""
    target = outside / name.replace("/", "_")
    if (folder / name).exists():
        (folder / name).rename(target)
    else:
        target.write_text("{}")
    (folder / name).symlink_to(target)
    return target


def refused(folder: Path, name: str) -> ModelError:
    with pytest.raises(ModelError) as e:
        ck = open_checkpoint(folder)
        ck.load_tokenizer()
    err = e.value
    assert Path(err.path).name == Path(name).name, err
    assert "outside the model folder" in str(err), err
    print("REFUSED:", err)
    return err


@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja", "tokenizer.json", "config.json",
                                  "generation_config.json", "special_tokens_map.json"])
def test_a_link_out_of_the_folder_is_refused(model, tmp_path, name):
    link_out(model, name, tmp_path)
    err = refused(model, name)
    assert str(tmp_path / name) in str(err)  # where it leads


def test_the_link_is_refused_before_its_target_is_read(model, tmp_path):
    """The target is not even valid JSON: the refusal is about the link, so nothing read it."""
    target = link_out(model, "tokenizer_config.json", tmp_path)
    target.write_text("not json {")
    refused(model, "tokenizer_config.json")
    target.write_bytes(b"\x00" * 10)
    link_out(model, "config.json", tmp_path).write_text("not json {")
    with pytest.raises(ModelError, match="outside the model folder"):
        Checkpoint(model)


def test_links_in_the_additional_chat_templates_folder(model, tmp_path):
    (model / "additional_chat_templates").mkdir()
    (tmp_path / "tool_use.jinja").write_text("{{ messages }}")
    (model / "additional_chat_templates" / "tool_use.jinja").symlink_to(tmp_path / "tool_use.jinja")
    refused(model, "additional_chat_templates/tool_use.jinja")
    shutil.rmtree(model / "additional_chat_templates")
    (model / "additional_chat_templates").symlink_to(tmp_path)  # the folder itself, linked out
    refused(model, "additional_chat_templates")


def test_a_synthetic_model_folder_is_checked_too(tmp_path):
    from engine.sources.synthetic import write_synthetic

    cfg = json.loads(Path(__file__).resolve().parents[1].joinpath("resources", "mixtral-8x7b-config.json").read_text())
    cfg.update(num_hidden_layers=1, num_local_experts=2, hidden_size=64, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=320)
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    folder = write_synthetic(tmp_path / "synth", tmp_path / "cfg.json")
    (tmp_path / "out").mkdir()
    link_out(folder, "tokenizer.json", tmp_path / "out")
    refused(folder, "tokenizer.json")


def test_links_inside_the_folder_and_a_loop(model):
    (model / "tokenizer_config.json").rename(model / "real_tokenizer_config.json")
    (model / "tokenizer_config.json").symlink_to("real_tokenizer_config.json")  # inside: fine
    open_checkpoint(model).load_tokenizer()
    (model / "a.json").symlink_to(model / "b.json")
    (model / "b.json").symlink_to(model / "a.json")
    with pytest.raises(ModelError, match="cannot be followed|outside the model folder") as e:
        Checkpoint(model)
    assert Path(e.value.path).name in ("a.json", "b.json")


def test_a_hub_cache_snapshot_still_loads(model, tmp_path):
    """models--org--name/snapshots/REV/x -> ../../blobs/HASH, as huggingface_hub lays it out."""
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, p in enumerate(sorted(model.iterdir())):
        blob = blobs / f"{i:040x}"
        shutil.copy(p, blob)
        os.symlink(os.path.join("..", "..", "blobs", blob.name), snap / p.name)
    ck = open_checkpoint(snap)
    tok = ck.load_tokenizer()
    from engine.prompts.chat_template import ChatTemplate

    assert ChatTemplate.of(tok, ck.folder).ids([{"role": "user", "content": "hi"}])
    # a snapshot's link that leaves the repository is refused all the same
    (tmp_path / "elsewhere.json").write_text("{}")
    (snap / "special_tokens_map.json").symlink_to(tmp_path / "elsewhere.json")
    refused(snap, "special_tokens_map.json")
