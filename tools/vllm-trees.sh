# Sourced by tools/test.sh and tools/vllm-engine-tests.sh: the vLLM trees of the supported commits
# (kvoffload.vllm_compat.SUPPORTED_VLLM_COMMITS), each vLLM's files at one commit with the whole
# import chain of its engine loop; next to a checkout in this workplace they are in ../shared/.
# KVOFFLOAD_VLLM_ENGINE_TREES (':'-separated) names others.
IFS=: read -r -a vllm_engine_trees <<<"${KVOFFLOAD_VLLM_ENGINE_TREES:-../shared/vllm-017e9f4448-engine:../shared/vllm-7cfb97e3-engine}"
