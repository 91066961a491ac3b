"""Evaluation harness: YAML tasks x experiment configs -> resumable predictions, metrics and reports.

    adafuse eval configs/quickstart.yaml [--limit N] [--output_path DIR] [--seed S] [--batch_size B] [--data_dir D]
    adafuse report results/quickstart [more dirs...] [--plot out.png] [--cost wall_s|forward_passes|tokens_processed]

Modules, one job each (the top floor: they may import `rlid`, `adafuse`, `specdec` and `runtime`):
- `cli`             the `adafuse` console script: dispatches each verb to its module, `--threads`, one-line errors;
- `cli_eval`        `adafuse eval CONFIG`: run every run x task, print the table and what each ensemble buys;
- `config`          experiment configs (`configs/*.yaml`, shipped in the wheel as `eval.configs`) -> `EvalConfig`;
- `task`            tasks declared in `eval/tasks/*.yaml` (lm-eval style) and their registry;
- `data`            where the benchmark data lives (`--data_dir` > config > `$ADAFUSE_DATA` > `../shared/data`),
                    the dataset loaders and their exemplar / test / dev split;
- `methods`         method name + members + options -> a generator (`single` or an `adafuse.Ensemble`);
- `runner`          the resumable loop writing `OUT/<run>/<task>/predictions.jsonl` + `metrics.json`;
- `folder_lock`     the advisory `flock` that keeps two processes out of one run folder;
- `batch_fit`       a batch that would not fit in free memory is cut into parts that do;
- `metrics`         answer-extraction filters, SQuAD EM/F1, GSM8K numeric match, sacreBLEU BLEU/chrF, bootstrap CIs;
- `paired`          paired evidence on the same examples: paired bootstrap differences, win/tie/loss;
- `report`          `adafuse report DIR...`: markdown table, score-vs-cost plot, paired tables, why words were lost;
- `tune`            `adafuse tune`'s search on dev rows (compatibility prior, successive halving, tie rule);
- `tune_cli`        `adafuse tune CONFIG`: the verb's flags;
- `tune_config`     tune configs (an eval config plus a `tune:` block), validated up front;
- `tune_results`    what flows between the tune stages and its report (candidates, rounds, outcomes);
- `tune_report`     what a tune leaves behind: `dev_table.md` and the tuned eval config;
- `lm_eval_model`   `--model adafuse` for lm-evaluation-harness (optional: imported only when lm-eval runs it);
- `lm_eval_scoring` log-likelihoods of text under our members, as lm-eval's `hf` model computes them;
- `lm_eval_cli`     `python -m eval.lm_eval_cli` / `adafuse-lm-eval`: lm-eval's CLI with our model and tasks;
- `adafuse_strict`  our strict task metrics as a Hugging Face `evaluate` module, loaded from a local path;
- `testing`         test helpers: a model-free fake generator, scripted methods and a tiny data folder.
The RLiD verb (`adafuse rlid`) lives with RLiD (`rlid.cli`, `rlid.config`, `rlid.eval_blocks`,
`rlid.report`); the YAML validator, config-file reading and predictions reading live in `runtime`
(`schema`, `config_files`, `predictions`), the floor every config reader stands on.
Folders: `tasks/` (our task YAMLs: gsm8k, nq_open, wmt22_*, and the chat-native *_chat), `lm_eval_tasks/` (`adafuse_gsm8k`,
`adafuse_nq_open` for lm-eval, with their helper module `utils.py`).
"""
