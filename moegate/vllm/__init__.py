"""The only package that imports vLLM (today: the in-process ``vllm bench serve`` runner of the A/B tier)."""
