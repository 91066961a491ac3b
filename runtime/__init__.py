"""The member runtime, the ground floor: a causal LM + tokenizer + KV cache for a batch of rows
(`member`, `kv_cache`), packed CPU kernels (`packed_linear`, `gqa_attention`), sampling, the
offline model registry, text <-> each member's ids (`text_state`), prompts, outputs and errors.

Imports nothing from `specdec`, `adafuse`, `rlid` or `eval`.
"""
