"""The member runtime, the ground floor every generation path stands on: one causal LM + its
tokenizer, run with a KV cache over a batch of rows. It imports nothing from `specdec`, `adafuse`,
`rlid` or `eval`.

- `member`       `Member` (model + tokenizer: prompts, text <-> ids, EOS, plain `generate`) and
                 `load_member` (a registry name, local folder or hub id);
- `loader`       every member spec (also a `(model, tokenizer)` pair or a `Member`) -> one cached
                 `Member`: `MemberLoader`, `load`;
- `kv_state`     `KVState`: a batch's ids + KV cache (append, next_probs, trees, score, rollback);
- `tree_mask`    pure masks and position ids of a forward that feeds a token forest;
- `logits_plan`  which logits a forward computes and how they are read back;
- `open_tree`    bookkeeping of a token tree fed but not yet accepted;
- `prefix_cache` prompt-prefix chunk KV shared across rows and calls;
- `kv_cache`     a KV cache that grows in place;
- `packed_linear`, `gqa_attention`  faster CPU kernels with the same outputs (and a batch-invariant mode);
- `sandbox`, `program_answers`  model-written programs run in a guarded process; a program view's answer;
- `schema`, `config_files`, `predictions`  the YAML validator, config-file reading, predictions.jsonl reading;
- `sampling`, `stopping`, `outputs`  warping and drawing tokens, stop strings, outputs and costs;
- `text_state`   shared text <-> one member's ids and cache (cross-tokenizer bookkeeping);
- `retokenize`   a growing text <-> ids under another tokenizer, touching only the changed tail
                 (what a drafter with another tokenizer follows the target by);
- `registry`, `cli_models`  the offline model registry and its CLI; `prompts`, `errors`, `testing`.
"""
