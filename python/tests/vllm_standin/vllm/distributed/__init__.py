"""Test stand-in for vLLM (see python/tests/vllm_standin/README.md)."""
