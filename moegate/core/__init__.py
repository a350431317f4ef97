"""The core: what a case is, which path the rule says it takes, the check, the goldens.

- ``case``: ``MoECase`` and its parts (placement, quantization, expert map, routing).
- ``spec``: the executable rule (``docs/spec.md`` in words): ordered clauses with reasons.
- ``check``: one case through a target, the path asserted against the spec.
- ``golden``: golden files (atomic writes, the obtained copy beside a mismatch).
- ``dispatch_table``: the dispatch-table golden's rows.
- ``tensors``: the tensors a case needs (decision-only inputs, shapes, dtypes).
- ``profiles``: the Hypothesis profiles (``MOEGATE_PROFILE``).
- ``progress``: the live progress line of long runs.

No vLLM here; ``case`` and ``spec`` import nothing but the standard library.
"""
