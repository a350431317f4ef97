"""docs/spec.md's table of examples is what moegate/core/spec.py says, row by row, under both rules."""

from __future__ import annotations

import pytest

from moegate.core.case import ENTRYPOINTS, ExpertMap, MoECase, Placement, Quant
from moegate.core.spec import expected_path
from tests.support import ROOT

DOC = ROOT / "docs" / "spec.md"


def example_rows() -> list[list[str]]:
    """The cells of each row of the examples table (the one whose header starts with ``entrypoint``)."""
    rows, inside = [], False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| entrypoint |"):
            inside = True
        elif inside and line.startswith("|") and not set(cells[0]) <= {"-"}:
            rows.append(cells)
        elif inside and not line.startswith("|"):
            break
    return rows


def as_case(tokens: str, top_k: str, experts: str, placement: str, emap: str, quant: str) -> MoECase:
    rank_size = None if emap == "-" else emap.split("/")
    scheme_group = None if quant == "-" else quant.split("/")
    return MoECase(
        num_tokens=int(tokens),
        top_k=int(top_k),
        num_experts=int(experts),
        placement=Placement.from_label(placement),
        expert_map=None if rank_size is None else ExpertMap(ep_size=int(rank_size[1]), ep_rank=int(rank_size[0])),
        quant=None if scheme_group is None else Quant(scheme_group[0], int(scheme_group[1])),
    )


ROWS = example_rows()


def test_the_page_has_its_examples():
    assert len(ROWS) >= 10 and all(len(r) == 9 for r in ROWS), ROWS


@pytest.mark.parametrize("row", ROWS, ids=lambda r: " ".join(r[:7]))
def test_each_example_is_what_the_spec_requires(row):
    entrypoint, *fields, path, base_path = row
    case = as_case(*fields)
    for ep in ENTRYPOINTS if entrypoint == "both" else (entrypoint,):
        assert str(expected_path(case, ep).path) == path, f"{ep}: spec says {expected_path(case, ep)}"
        base = expected_path(case, ep, host_rule=False)
        assert str(base.path) == base_path, f"{ep}, 0.32.0 rule: spec says {base}"
