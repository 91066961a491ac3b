"""Evaluation harness: YAML tasks x experiment configs -> resumable predictions, metrics and reports.

    adafuse eval configs/quickstart.yaml [--limit N] [--output_path DIR] [--seed S] [--batch_size B] [--data_dir D]
    adafuse report results/quickstart [more dirs...] [--plot out.png] [--cost wall_s|forward_passes|tokens_processed]

Layout (one job per module):
- `task`     tasks declared in `eval/tasks/*.yaml` (lm-eval style: `doc_to_text`, `until`, `filter`,
             `metric_list`, `version`) and their registry (`available_tasks`, `get_task`);
- `data`     where the benchmark data lives (`--data_dir` > config > `$ADAFUSE_DATA` >
             `../shared/data`) and the dataset loaders with their exemplar/eval split;
- `metrics`  answer-extraction filters, SQuAD EM/F1, GSM8K numeric match, sacreBLEU BLEU/chrF from
             sufficient statistics, bootstrap CIs;
- `config`   experiment configs (`configs/*.yaml`), validated into `EvalConfig`;
- `methods`  `build_generator(method, members, **options)`: `single` (member runtime, optionally
             speculative with a `drafter`) or `adafuse.Ensemble` for every ensemble method;
- `runner`   the resumable loop writing `OUT/<run>/<task>/predictions.jsonl` + `metrics.json`;
- `cli`, `report`  the two subcommands; `testing` a model-free fake generator and tiny data;
- `lm_eval_model`, `lm_eval_scoring`, `lm_eval_cli`, `lm_eval_tasks/`  `--model adafuse` for
             lm-evaluation-harness (optional: imported only when lm-eval runs it).
"""
