"""The tiny Qwen3-MoE the e2e, A/B and lifecycle tests run, built locally (nothing is downloaded).

- ``tiny_model``: the deterministic checkpoint builder (``python -m moegate.model.tiny_model``).
- ``tokenizer``: the byte-level BPE tokenizer trained on GSM8K's training split.
- ``tiny_train``: the trained tiny model's recipe and training, and its committed copy (``models/e2e-trained/``).
- ``engine``: one scenario of vLLM's offline engine on the tiny model (``python -m moegate.model.engine``).
- ``quant_formats``, ``quantize``: the tiny model written pre-quantized (``python -m moegate.model.quantize``).
"""
