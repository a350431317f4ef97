"""The kernel tier: real values through vLLM's fused-MoE kernels, compared with a torch reference.

- ``inputs``: the cases' weights and activations (``WeightBank``: cached, UVA host views).
- ``reference``: the torch reference (fp32 accumulation) and the closeness measure.
- ``check``: one case run and compared (``run_checked``, the stage clock).
- ``workers``: the worker-process pool the sweep runs in.
- ``sweep``: ``python -m moegate.kernels.sweep``, the nightly sweep (``nox -s kernel-sweep``).
- ``traffic``: the expert-weight traffic model (naive vs sorted row blocks).
- ``wna16_blocks``: the wNa16 block sizes vLLM's heuristic picks, checked against the kernel space.
"""
