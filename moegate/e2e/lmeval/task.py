"""The GSM8K gate's task: its settings, where its data and lm-eval are, the task YAML lm-eval reads.

lm-eval 0.4.13's own ``gsm8k`` settings, pointed at the local GSM8K JSONL files (checked
against their published sha256); ``moegate.e2e.lmeval`` is the package."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.e2e import gsm8k_files
from moegate.paths import ENVS_DIR, GSM8K_ENV

LM_EVAL_VERSION = "0.4.13"
"""The release the task settings, the command line and the samples parser are written for."""


LOCAL_TASK = "moegate_gsm8k"
"""The task the project writes (GSM8K from local JSONL); ``gsm8k`` is lm-eval's own."""


TASKS = (LOCAL_TASK, "gsm8k")


FILTERS = ("strict-match", "flexible-extract")


DEFAULT_LIMIT = 250


ALL_QUESTIONS = 1319


NUM_FEWSHOT = 5


NUM_CONCURRENT = 4


SEED = 0
"""``--seed 0``: Python, numpy, torch and few-shot sampling seeds all 0, the same for every build."""


CHECKSUMS = gsm8k_files.GSM8K_SHA256
"""The data set's own checksums (``moegate/e2e/gsm8k_files.py`` keeps them, with their source)."""


DATA_ENV = GSM8K_ENV


EVAL_PYTHON_ENV = "MOEGATE_EVAL_PYTHON"


# lm-eval 0.4.13's own task, lm_eval/tasks/gsm8k/gsm8k.yaml (EleutherAI/lm-evaluation-harness,
# release 0.4.13, ``metadata.version: 3.0``): every setting below is copied from it; only the
# data source (``dataset_path: openai/gsm8k``, ``dataset_name: main`` there) is replaced by the
# local JSONL files, which hold the same records.
GSM8K_TASK_SETTINGS: dict[str, Any] = {
    "output_type": "generate_until",
    "training_split": "train",
    "fewshot_split": "train",
    "test_split": "test",
    "doc_to_text": "Question: {{question}}\nAnswer:",
    "doc_to_target": "{{answer}}",
    "metric_list": [
        {
            "metric": "exact_match",
            "aggregation": "mean",
            "higher_is_better": True,
            "ignore_case": True,
            "ignore_punctuation": False,
            "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"],
        }
    ],
    "generation_kwargs": {
        "until": ["Question:", "</s>", "<|im_end|>"],
        "do_sample": False,
        "temperature": 0.0,
    },
    "repeats": 1,
    "num_fewshot": NUM_FEWSHOT,
    "filter_list": [
        {
            "name": "strict-match",
            "filter": [
                {"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
                {"function": "take_first"},
            ],
        },
        {
            "name": "flexible-extract",
            "filter": [
                {"function": "regex", "group_select": -1, "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                {"function": "take_first"},
            ],
        },
    ],
    "metadata": {"version": 3.0},
}


class Gsm8kError(RuntimeError):
    """The gate cannot run or read a run: one clear line (plus lm-eval's last log lines where it failed)."""


class Gsm8kDataError(Gsm8kError):
    """A missing or wrong-checksum GSM8K file."""


class LmEvalMissing(Gsm8kError):
    """lm-eval is not importable (or not the expected release) in the given interpreter."""


# --- where things are ----------------------------------------------------------


def eval_python(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The interpreter that runs lm-eval: ``explicit``, else ``$MOEGATE_EVAL_PYTHON``, else ``.nox/_eval``.

    A venv directory stands for its ``bin/python``. Nothing is checked here:
    ``check_lm_eval`` says in one line whether lm-eval imports there.
    """
    spec = explicit or os.environ.get(EVAL_PYTHON_ENV) or ENVS_DIR / "_eval" / "bin" / "python"
    path = (
        Path(spec).expanduser().absolute()
    )  # absolute: lm-eval runs in the run folder; not resolved: a venv's python is a link
    if path.is_dir():
        path = path / "bin" / "python"
    return path


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$MOEGATE_GSM8K_DIR``, else ``moegate fetch-gsm8k``'s folder (``datasets.gsm8k_dir``)."""
    return gsm8k_files.gsm8k_dir(explicit)


@dataclass(frozen=True)
class Gsm8kData:
    folder: Path
    test: Path
    train: Path
    sha256: dict[str, str]


def verify_data(folder: str | os.PathLike[str] | None = None) -> Gsm8kData:
    """The checked data folder; a missing file or a wrong checksum is one line (``Gsm8kDataError``)."""
    try:
        test, train = (gsm8k_files.gsm8k_file(n, folder) for n in ("test.jsonl", "train.jsonl"))
    except gsm8k_files.DataError as exc:
        raise Gsm8kDataError(f"GSM8K data: {exc}") from None
    return Gsm8kData(test.parent.resolve(), test.resolve(), train.resolve(), dict(gsm8k_files.GSM8K_SHA256))


# --- the task YAML -------------------------------------------------------------


def task_config(data: Gsm8kData, task: str = LOCAL_TASK) -> dict[str, Any]:
    return {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.test), "train": str(data.train)}},
        **GSM8K_TASK_SETTINGS,
    }


def write_task_yaml(folder: str | os.PathLike[str], data: Gsm8kData, task: str = LOCAL_TASK) -> Path:
    """Write ``<folder>/<task>.yaml`` (the folder becomes lm-eval's ``--include_path``)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    header = [
        "# Written by moegate.e2e.lmeval at run time: lm-eval 0.4.13's own gsm8k task settings",
        "# (lm_eval/tasks/gsm8k/gsm8k.yaml) on the local GSM8K JSONL files. Do not commit.",
    ]
    import yaml  # PyYAML: lm-eval reads the task with it too

    path = out / f"{task}.yaml"
    body = yaml.safe_dump(task_config(data, task), sort_keys=False, default_flow_style=False, width=1000)
    path.write_text("\n".join(header) + "\n" + body, encoding="utf-8")
    return path
