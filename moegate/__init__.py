"""moegate: a property-based and differential test suite and CI gate for vLLM's fused-MoE dispatch."""

__version__ = "0.1.0"
