"""The decoder families' registry: one table keyed by model_type (and by GGUF architecture), each family's presets
read back as that family, an unknown model_type named with the known ones, and the family modules kept free of the
loaders that use them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from icml_jax.models import ModelConfig, ModelConfigError, families
from icml_jax.models.config import FAMILIES
from icml_jax.models.presets import PRESETS

FAMILY_DIR = Path(families.__file__).parent


def test_every_model_type_and_gguf_architecture_has_one_family():
    types = [t for f in families.REGISTRY for t in f.model_types]
    assert len(types) == len(set(types)) and set(types) == set(families.BY_MODEL_TYPE)
    assert FAMILIES == tuple(f.name for f in families.REGISTRY) == ("llama", "qwen2", "qwen3", "gemma3")
    assert sorted(families.BY_MODEL_TYPE) == ["gemma3", "gemma3_text", "llama", "qwen2", "qwen3"]
    for arch, family in families.BY_GGUF_ARCH.items():
        assert family.gguf.arch == arch and family.gguf.model_type in family.model_types


def test_an_unknown_model_type_names_the_known_ones():
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_hf({"model_type": "phi3"}, source="m/config.json")
    message = str(info.value)
    assert message.startswith("m/config.json: unsupported model_type 'phi3'; supported: ")
    for model_type in families.BY_MODEL_TYPE:
        assert repr(model_type) in message
    assert "(Llama-3.x, Qwen2/Qwen2.5, Qwen3, Gemma3)" in message


@pytest.mark.parametrize("family", families.REGISTRY, ids=lambda f: f.name)
def test_each_familys_presets_read_back_as_that_family(family):
    for name, hf in family.presets.items():
        assert PRESETS[name] is hf and hf["model_type"] in family.model_types
        assert ModelConfig.from_hf(hf).family == family.name, name
    assert sum(len(f.presets) for f in families.REGISTRY) == len(PRESETS)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_family_modules_stand_below_the_loaders():
    """A family is data and checks: it reads config keys, rope settings and GGUF metadata, never the loaders,
    the decoder, the writers or the `gguf` / `transformers` packages."""
    allowed = re.compile(r"^(__future__|dataclasses|math|collections\.abc|typing|numpy|icml_jax\.models\.("
                         r"config_keys|rope|gguf_common|families(\.\w+)?))$")
    bad = {f"{f.name}: {m}" for f in sorted(FAMILY_DIR.glob("*.py")) for m in _imports(f) if not allowed.match(m)}
    assert not bad, sorted(bad)
