"""What tests draw from: ``moegate.testing.strategies``, the Hypothesis strategies (as xarray keeps its own)."""
