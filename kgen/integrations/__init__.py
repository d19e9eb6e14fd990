"""Serving-engine integrations. `kgen.integrations.sglang`: the SGLang attention backend "kgen"
(registered through SGLang's plugin entry point); `defrag_planner`: tier-0 KV defragmentation."""
