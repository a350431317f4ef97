"""A stand-in vLLM for gate power's own tests: the dispatch code as text (``FUSED``, ``TRITON``) laid out as an installed package."""

from __future__ import annotations

import textwrap
from pathlib import Path

from moegate.power.regions import FUSED_MOE, TRITON_MOE

FUSED = textwrap.dedent(
    '''\
    """A synthetic stand-in for vllm's fused_moe.py: same names, tiny bodies."""


    def helper():
        return 1


    def _weights_host_resident(*weights):
        """Docstring: not mutated."""
        return any(getattr(w, "_vllm_is_uva_offloaded", False) for w in weights)


    def _prepare_expert_assignment(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, *, weights_host_resident=False):
        """Docstring."""
        naive = expert_map is None and not weights_host_resident and num_tokens * top_k_num * 4 <= global_num_experts
        return "naive" if naive else "sorted"


    def fused_experts_impl(w1, w2, topk_ids, global_num_experts=-1):
        E = len(w1)
        if global_num_experts == -1:
            global_num_experts = E
        return _prepare_expert_assignment(
            topk_ids,
            {},
            len(topk_ids),
            1,
            global_num_experts,
            None,
            weights_host_resident=_weights_host_resident(w1, w2),
        )
    '''
)


TRITON = textwrap.dedent(
    """\
    from vllm.model_executor.layers.fused_moe.fused_moe import _prepare_expert_assignment, _weights_host_resident


    class TritonExperts:
        def apply(self, w1, w2, topk_ids, global_num_experts, expert_map):
            num_align_experts = len(w1) if expert_map is None else global_num_experts
            return _prepare_expert_assignment(
                topk_ids, {}, len(topk_ids), 1, num_align_experts, expert_map,
                weights_host_resident=_weights_host_resident(w1, w2),
            )


    class TritonWNA16Experts(TritonExperts):
        def apply(self, w1, w2, topk_ids, global_num_experts, expert_map):
            num_align_experts = 0
            return num_align_experts
    """
)


def lines_of(text: str, needle: str) -> int:
    """1-based number of the first line containing ``needle`` (or equal to it, stripped, for a bare argument)."""
    lines = text.splitlines()
    exact = [i for i, line in enumerate(lines, 1) if line.strip() == needle.strip()]
    return exact[0] if exact else next(i for i, line in enumerate(lines, 1) if needle in line)


def sources(fused: str = FUSED, triton: str = TRITON) -> dict[str, str]:
    return {FUSED_MOE: fused, TRITON_MOE: triton}


def fake_vllm(root: Path, fused: str = FUSED, triton: str = TRITON) -> Path:
    """A site-packages-like dir with a `vllm` package holding the two target files and a bystander."""
    pkg = root / "vllm"
    for rel, text in {FUSED_MOE: fused, TRITON_MOE: triton}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    (pkg / "__init__.py").write_text("__version__ = 'synthetic'\n")
    (pkg / "model_executor" / "other.py").write_text("X = 1\n")
    (pkg / "model_executor" / "layers" / "fused_moe" / "__pycache__").mkdir()
    (pkg / "model_executor" / "layers" / "fused_moe" / "__pycache__" / "fused_moe.cpython-311.pyc").write_bytes(
        b"stale"
    )
    return pkg
