"""Running vLLM servers, shared by the e2e and A/B tiers: nothing here imports vLLM.

- ``build``: a build under test (its Python, environment, server flags).
- ``server``: one ``vllm serve`` process of a build, started, waited for, torn down.
- ``client``: the HTTP client the gates speak to it with.
- ``processes``: the one process-group helper (liveness, stopping a tree).
"""
