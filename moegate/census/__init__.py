"""The census of vLLM's fused-MoE configurations, read from vLLM's installed source as text.

Nothing here imports vLLM, torch or a model file: every fact comes from parsing the
installed package's ``.py`` files with ``ast`` and listing its tuned-config folder.

- ``source``: where the installed vLLM is and which release it is (``CensusError``).
- ``syntax``: parsing, expression text, calls with their enclosing scopes.
- ``builders``: the fused-MoE layer builder(s) vLLM's models call, and their defaults.
- ``layers``: every model class that builds a fused-MoE layer, with what it asks for.
- ``configs``: model-config class defaults (vLLM's own and transformers'), for values.
- ``tuned``: the tuned fused-MoE config file names, and the shapes they imply.
- ``sites``: every caller of the assignment decision and of the alignment, classified.
- ``reviewed``: the reviewed classification of the sites the rules cannot classify alone.
- ``census``: all of the above as one sorted list of JSON lines (the golden's body).
- ``__main__``: ``python -m moegate.census [--check | --bless | --out FILE]``.
"""
