"""RLiD: decision-plane models (floor 3, beside `adafuse`, on top of `runtime`).

An LM picks an action from a labelled menu in one forward pass (`rlid.decision_model`), is trained
with policy gradients on the option probabilities (`rlid.train`), distilled into a generating model
(`rlid.distill`), and fused with other members over the same menu (`rlid.ensemble`).
The method and this project's design choices: `docs/rlid.md` (from `../shared/docs/rlid.md`).
The types that flow between these stages are in `rlid.types`. Its command line lives here too:
`rlid.cli` (`adafuse rlid train|eval|distill|report CONFIG`), `rlid.config` (the YAML configs),
`rlid.eval_blocks` (held-out evaluation written as it goes), `rlid.report` (tables and curves)."""
