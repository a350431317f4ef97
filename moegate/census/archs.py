"""Which model architectures a vLLM model file serves, and their config classes, read from two static tables.

vLLM's model registry (``model_executor/models/registry.py``) maps each architecture
name a checkpoint declares (``Qwen3MoeForCausalLM``) to the module and class that
serve it; transformers' auto tables map the same architecture names to a model
type (``modeling_auto.py``: ``qwen3_moe``) and each model type to its config class
(``CONFIG_MAPPING_NAMES``: ``Qwen3MoeConfig``). Joined, they name the config classes
whose defaults pin a model file's ``config.X`` (``moegate.census.configs``),
even where the file itself never names its config class. All three are dict
literals, read without importing anything.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cached_property
from pathlib import Path

from moegate.census.source import VllmSource
from moegate.census.syntax import parse

REGISTRY = "model_executor/models/registry.py"
MODELS = "model_executor/models"


def _pairs(node: ast.AST) -> list[tuple[str, object]]:
    """(key, value) of a dict literal or an ``OrderedDict([(k, v), ...])`` call, string keys only."""
    out: list[tuple[str, object]] = []
    if isinstance(node, ast.Dict):
        for k, v in zip(node.keys, node.values):
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                try:
                    out.append((k.value, ast.literal_eval(v)))
                except ValueError:
                    continue
    elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.List | ast.Tuple):
        for elt in node.args[0].elts:
            if isinstance(elt, ast.Tuple) and len(elt.elts) == 2 and isinstance(elt.elts[0], ast.Constant):
                try:
                    out.append((str(elt.elts[0].value), ast.literal_eval(elt.elts[1])))
                except ValueError:
                    continue
    return out


def _assigned_tables(path: Path) -> list[list[tuple[str, object]]]:
    if not path.is_file():
        return []
    tables = []
    for node in parse(path).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            tables.append(_pairs(node.value))
    return tables


class Architectures:
    """Config classes per vLLM model file, through the architectures it serves."""

    def __init__(self, src: VllmSource) -> None:
        self.src = src

    @cached_property
    def _archs_by_file(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for table in _assigned_tables(self.src.path(REGISTRY)):
            for arch, entry in table:
                if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
                    continue
                module = entry[0]
                if module.startswith("vllm."):
                    rel = module[len("vllm.") :].replace(".", "/")
                else:
                    rel = f"{MODELS}/{module.replace('.', '/')}"
                out[rel].add(arch)
        return out

    @cached_property
    def _config_by_arch(self) -> dict[str, str]:
        auto = self.src.site / "transformers" / "models" / "auto"
        model_type: dict[str, str] = {}
        for table in _assigned_tables(auto / "modeling_auto.py"):
            for mtype, classes in table:
                for cls in classes if isinstance(classes, tuple | list) else (classes,):
                    if isinstance(cls, str):
                        model_type.setdefault(cls, mtype)
        config: dict[str, str] = {}
        for name in ("auto_mappings.py", "configuration_auto.py"):
            for table in _assigned_tables(auto / name):
                for mtype, cls in table:
                    if isinstance(cls, str) and cls.endswith("Config"):
                        config.setdefault(mtype, cls)
        return {arch: config[mt] for arch, mt in model_type.items() if mt in config}

    def config_classes(self, rel_file: str) -> list[str]:
        """Config classes of the architectures served by ``rel_file`` (its module, or the package it is in)."""
        archs: set[str] = set()
        for rel, names in self._archs_by_file.items():
            if rel_file == rel + ".py" or rel_file.startswith(rel + "/"):
                archs |= names
        return sorted({self._config_by_arch[a] for a in archs if a in self._config_by_arch})
