"""``data inspect``: what a training YAML's data turns into, measured with LLaMA-Factory's own code.

Reads the YAML with LLaMA-Factory's argument dataclasses, loads and converts each dataset with
``data.loader._load_single_dataset`` (the function training uses, with the registry seams and the
row guard), and tokenizes with the model's tokenizer and LLaMA-Factory's template and
``SupervisedDatasetProcessor``. No LLaMA-Factory function reports per-dataset drops, lengths or
packing, so this module does the bookkeeping: per dataset and for the mixture in training order
(reproduced with LLaMA-Factory's ``merge_dataset``/``split_dataset`` on row indices), it counts
rows read, dropped (by reason, with row indices), truncated; token-length percentiles; packed
sequences at ``cutoff_len``; packing efficiency; optimizer steps per epoch.

The plugin's dataset seams must be in LLaMA-Factory when this runs: the import hook puts them there
when ``llamafactory.data.loader`` is imported, and ``llamafactory-zebra data inspect`` installs them
itself (``integration.datasets.install_dataset_seams``, which also checks the private
``_load_single_dataset`` has not drifted); this module, below ``integration/``, only calls them.

Limits, also printed in the report: a streamed mixture is shuffled over the rows read (one shard),
while training shuffles the hub's shards, so its packed count is an estimate; per-dataset numbers
are exact for the rows read.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..hparams import (
    RunArguments,
    data_parallel_size,
    optimizer_steps_per_epoch,
    read_run_arguments,
    total_optimizer_steps,
)
from .report_arithmetic import count_packs, length_summary, map_batches
from .row_policy import REPORT_ATTRIBUTE
from .validation import DROP_REASON_COLUMN, split_reason

if TYPE_CHECKING:
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.hparams import DataArguments, TrainingArguments

DEFAULT_STREAMING_ROW_LIMIT = 10_000
# Keys that configure the launcher, not the data; DeepSpeed's would try to load its json here.
LAUNCH_ONLY_KEYS = ("deepspeed", "fsdp", "fsdp_config")
ALIGNED_COLUMNS = ("_prompt", "_response", "_system", "_tools", "_images", "_videos", "_audios")
UNLIMITED_LENGTH = 1 << 62
ROW_EXAMPLES_PER_REASON = 10
INVALID_TURNS = (
    "invalid turn structure: LLaMA-Factory's SFT processor needs an odd number of prompt turns and one response"
)


@dataclass
class MeasuredRows:
    """Per-row outcome for one dataset, in read order; lengths are ``None`` for dropped rows."""

    reasons: list[str] = field(default_factory=list)
    full_lengths: list[int | None] = field(default_factory=list)
    train_lengths: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.reasons)


@dataclass
class DataReport:
    name: str
    rows_read: int
    rows_kept: int
    rows_dropped: dict[str, int]
    dropped_rows: dict[str, list[int]]
    first_drop_detail: dict[str, str]
    rows_truncated: int
    token_lengths: dict[str, float]
    train_tokens: int
    sequences: int
    packed_sequences: int
    packing_efficiency: float
    steps_per_epoch: int
    notes: list[str] = field(default_factory=list)


@dataclass
class InspectReport:
    config: str
    settings: dict[str, Any]
    datasets: list[DataReport]
    mixture: DataReport
    lengths: dict[str, list[int]] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "settings": self.settings,
            "datasets": [asdict(report) for report in self.datasets],
            "mixture": asdict(self.mixture),
        }


def load_train_arguments(config_path: str) -> RunArguments:
    """A training YAML's arguments parsed as LLaMA-Factory does, plus this plugin's keys
    (``hparams.read_run_arguments``).

    Keys of other plugins are tolerated; launcher keys (DeepSpeed/FSDP) are ignored, and
    ``output_dir`` may be missing: inspection writes nothing there.
    """
    _, run = read_run_arguments(config_path, ignore=LAUNCH_ONLY_KEYS, overrides={"report_to": "none"})
    if run.finetuning.stage != "sft":
        raise ValueError(f"{config_path}: data inspect reports SFT data; stage is {run.finetuning.stage!r}")
    if not run.data.dataset:
        raise ValueError(f"{config_path}: no `dataset:` to inspect")
    return run


def structural_reason(row: dict[str, Any]) -> str:
    """The drop reason for a converted row: the guard's, or LLaMA-Factory's own SFT turn check."""
    reason = row.get(DROP_REASON_COLUMN) or ""
    if not reason and (len(row["_prompt"]) % 2 != 1 or len(row["_response"]) != 1):
        reason = INVALID_TURNS
    return reason


def measure_rows(rows: Any, full_processor: Any, train_processor: Any, batch_size: int, progress: Any) -> MeasuredRows:
    """Tokenizes kept rows with LLaMA-Factory's SFT processor: untruncated, then at ``cutoff_len``.

    Rows that fit the cutoff are encoded once (truncation cannot change them); only longer rows
    are encoded a second time with the real cutoff, so the truncated length is LLaMA-Factory's.
    """
    measured = MeasuredRows()
    pending: list[tuple[int, dict[str, Any]]] = []
    cutoff = train_processor.data_args.cutoff_len

    def encode(processor: Any, batch_rows: list[dict[str, Any]]) -> list[int]:
        batch = {column: [row[column] for row in batch_rows] for column in ALIGNED_COLUMNS}
        lengths = [len(ids) for ids in processor.preprocess_dataset(batch)["input_ids"]]
        if len(lengths) != len(batch_rows):
            raise RuntimeError("LLaMA-Factory's processor dropped a row that passed its own turn check")
        return lengths

    def flush() -> None:
        for (index, row), length in zip(pending, encode(full_processor, [row for _, row in pending]), strict=True):
            measured.full_lengths[index] = length
            measured.train_lengths[index] = length if length <= cutoff else encode(train_processor, [row])[0]
        pending.clear()

    for index, row in enumerate(rows):
        reason = structural_reason(row)
        measured.reasons.append(reason)
        measured.full_lengths.append(None)
        measured.train_lengths.append(None)
        if not reason:
            pending.append((index, row))
            if len(pending) >= batch_size:
                flush()
        progress.update(1)
    flush()
    return measured


@dataclass
class PackingSettings:
    cutoff_len: int
    packing: bool
    per_device_batch_size: int
    gradient_accumulation_steps: int
    world_size: int
    drop_last: bool
    batch_size: int
    num_proc: int | None

    @property
    def capacity(self) -> int:
        """Longest row a packed sequence takes: LLaMA-Factory packs to ``cutoff_len - 1`` plus one pad."""
        return self.cutoff_len - 1


def summarize(name: str, measured: MeasuredRows, settings: PackingSettings, notes: list[str]) -> DataReport:
    kept = [length for length in measured.train_lengths if length is not None]
    full = [length for length in measured.full_lengths if length is not None]
    train_cutoff = settings.capacity if settings.packing else settings.cutoff_len
    kinds: Counter[str] = Counter()
    examples: dict[str, list[int]] = {}
    details: dict[str, str] = {}
    for index, reason in enumerate(measured.reasons):
        if reason:
            kind, detail = split_reason(reason)
            kinds[kind] += 1
            details.setdefault(kind, detail)
            rows = examples.setdefault(kind, [])
            if len(rows) < ROW_EXAMPLES_PER_REASON:
                rows.append(index)
    batches = map_batches(len(measured), settings.batch_size, settings.num_proc)
    packs = count_packs(measured.train_lengths, batches, settings.capacity)
    packed_tokens = sum(min(length, settings.capacity) for length in kept)
    sequences = packs if settings.packing else len(kept)
    return DataReport(
        name=name,
        rows_read=len(measured),
        rows_kept=len(kept),
        rows_dropped=dict(kinds),
        dropped_rows=examples,
        first_drop_detail=details,
        rows_truncated=sum(length > train_cutoff for length in full),
        token_lengths=length_summary(full),
        train_tokens=sum(kept),
        sequences=sequences,
        packed_sequences=packs,
        packing_efficiency=packed_tokens / (packs * settings.cutoff_len) if packs else 0.0,
        steps_per_epoch=optimizer_steps_per_epoch(
            sequences,
            settings.per_device_batch_size,
            settings.gradient_accumulation_steps,
            settings.world_size,
            settings.drop_last,
        ),
        notes=notes,
    )


def _index_rows(source: int, count: int) -> Any:
    for row in range(count):
        yield {"source": source, "row": row}


def mixture_order(row_counts: list[int], data_args: DataArguments, seed: int) -> list[tuple[int, int]]:
    """(dataset, row) pairs in the order training sees them: LLaMA-Factory's mixing on index columns.

    Mixing and splitting depend only on the datasets' lengths, the strategy and the seed, so
    running them on (dataset, row) columns gives training's order without touching the text.
    """
    from datasets import Dataset, Features, IterableDataset, Value
    from llamafactory.data.data_utils import merge_dataset, split_dataset

    features = Features({"source": Value("int64"), "row": Value("int64")})
    parts = []
    for source, count in enumerate(row_counts):
        if data_args.streaming:
            kwargs = {"source": source, "count": count}
            parts.append(IterableDataset.from_generator(_index_rows, features=features, gen_kwargs=kwargs))
        else:
            parts.append(Dataset.from_dict({"source": [source] * count, "row": list(range(count))}, features=features))
    merged = merge_dataset(parts, data_args, seed=seed)
    train = split_dataset(merged, None, data_args, seed=seed)[0].get("train")
    return [] if train is None else [(item["source"], item["row"]) for item in train]


def streams_nothing(attr: DatasetAttr, data_args: DataArguments, training_args: TrainingArguments) -> bool:
    """LLaMA-Factory 0.9.5 streams a local file through ``to_iterable_dataset(num_shards=
    dataloader_num_workers)``: with the default 0 workers that is an empty stream, and training
    stops with a bare ``StopIteration`` in ``align_dataset``."""
    return bool(data_args.streaming) and attr.load_from == "file" and training_args.dataloader_num_workers == 0


EMPTY_STREAM_NOTE = (
    "not read: LLaMA-Factory 0.9.5 streams a local file as zero shards when dataloader_num_workers is 0 "
    "(training fails with StopIteration); set dataloader_num_workers >= 1 or streaming: false"
)


@dataclass
class InspectionInputs:
    """Everything the report is computed from: LLaMA-Factory's parsed arguments and its SFT processors."""

    config_path: str
    model_args: Any
    data_args: Any
    training_args: Any
    sequence_parallel: int
    data_parallel: int
    row_limit: int | None
    settings: PackingSettings
    full_processor: Any
    """Encodes without truncation (the rows' real lengths)."""
    train_processor: Any
    """Encodes at ``cutoff_len`` (what training sees)."""


@dataclass
class MeasuredDataset:
    name: str
    rows: MeasuredRows
    notes: list[str]


def load_inputs(config_path: str, max_rows: int | None, world_size: int | None) -> InspectionInputs:
    """Parses the YAML, loads the tokenizer and template, and builds the two SFT processors."""
    import transformers
    from llamafactory.data.processor import SupervisedDatasetProcessor
    from llamafactory.data.template import get_template_and_fix_tokenizer
    from llamafactory.model import load_tokenizer

    run = load_train_arguments(config_path)
    model_args, data_args, training_args = run.model, run.data, run.training
    sequence_parallel = run.zebra.sequence_parallel_size
    data_parallel = data_parallel_size(world_size, sequence_parallel)
    transformers.set_seed(training_args.seed)
    tokenizer_module = load_tokenizer(model_args)
    tokenizer, processor = tokenizer_module["tokenizer"], tokenizer_module["processor"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)

    row_limit = max_rows if max_rows is not None else (DEFAULT_STREAMING_ROW_LIMIT if data_args.streaming else None)
    if row_limit is not None and not data_args.streaming:
        data_args.max_samples = min(data_args.max_samples or row_limit, row_limit)
    full_args = copy.copy(data_args)
    full_args.cutoff_len = UNLIMITED_LENGTH
    settings = PackingSettings(
        cutoff_len=data_args.cutoff_len + 1 if data_args.packing else data_args.cutoff_len,
        packing=bool(data_args.packing),
        per_device_batch_size=training_args.per_device_train_batch_size,
        gradient_accumulation_steps=training_args.gradient_accumulation_steps,
        world_size=data_parallel,
        drop_last=training_args.dataloader_drop_last,
        batch_size=data_args.preprocessing_batch_size,
        num_proc=None if data_args.streaming else data_args.preprocessing_num_workers,
    )
    return InspectionInputs(
        config_path=config_path,
        model_args=model_args,
        data_args=data_args,
        training_args=training_args,
        sequence_parallel=sequence_parallel,
        data_parallel=data_parallel,
        row_limit=row_limit,
        settings=settings,
        full_processor=SupervisedDatasetProcessor(
            template=template, tokenizer=tokenizer, processor=processor, data_args=full_args
        ),
        train_processor=SupervisedDatasetProcessor(
            template=template, tokenizer=tokenizer, processor=processor, data_args=data_args
        ),
    )


def measure_datasets(inputs: InspectionInputs, show_progress: bool) -> list[MeasuredDataset]:
    """Loads each dataset as training does (registry seams, row guard) and measures every row."""
    import llamafactory.data.loader as loader_module
    from llamafactory.data.parser import get_dataset_list
    from tqdm.auto import tqdm

    load_single_dataset = loader_module._load_single_dataset  # the plugin's seam (see the module docstring)
    data_args, training_args, row_limit = inputs.data_args, inputs.training_args, inputs.row_limit
    names = list(data_args.dataset)
    measured: list[MeasuredDataset] = []
    for name, attr in zip(names, get_dataset_list(names, data_args.dataset_dir), strict=True):
        setattr(attr, REPORT_ATTRIBUTE, True)  # the report lists every refused row instead of stopping at them
        if streams_nothing(attr, data_args, training_args):
            measured.append(MeasuredDataset(name, MeasuredRows(), [EMPTY_STREAM_NOTE]))
            continue
        rows = load_single_dataset(attr, inputs.model_args, data_args, training_args)
        if data_args.streaming and row_limit is not None:
            rows = rows.take(row_limit)
            total = row_limit
        else:
            total = len(rows) if hasattr(rows, "__len__") else None
        with tqdm(total=total, desc=f"inspecting {name}", unit="rows", disable=not show_progress) as progress:
            rows_measured = measure_rows(
                rows, inputs.full_processor, inputs.train_processor, inputs.settings.batch_size, progress
            )
        measured.append(MeasuredDataset(name, rows_measured, []))
    return measured


def mix(measured: list[MeasuredDataset], inputs: InspectionInputs) -> MeasuredRows:
    """The measured rows of all datasets in the order training sees them (``mixture_order``)."""
    order = mixture_order([len(m.rows) for m in measured], inputs.data_args, inputs.training_args.seed)
    mixed = MeasuredRows()
    for source, row in order:
        rows = measured[source].rows
        mixed.reasons.append(rows.reasons[row])
        mixed.full_lengths.append(rows.full_lengths[row])
        mixed.train_lengths.append(rows.train_lengths[row])
    return mixed


def report(inputs: InspectionInputs, measured: list[MeasuredDataset], mixed: MeasuredRows) -> InspectReport:
    """Per-dataset and mixture summaries plus the settings they were computed under."""
    data_args, training_args, settings = inputs.data_args, inputs.training_args, inputs.settings
    reports = [summarize(m.name, m.rows, settings, m.notes) for m in measured]
    mixture_notes = []
    if data_args.streaming:
        mixture_notes.append("streamed mixture shuffled over the rows read; training shuffles hub shards too")
    mixture = summarize("mixture (training order)", mixed, settings, mixture_notes)
    report_settings = {
        "model": inputs.model_args.model_name_or_path,
        "template": data_args.template,
        "enable_thinking": data_args.enable_thinking,
        "cutoff_len": settings.cutoff_len,
        "packing": bool(data_args.packing),
        "neat_packing": bool(data_args.neat_packing),
        "streaming": bool(data_args.streaming),
        "row_limit": inputs.row_limit,
        "mix_strategy": data_args.mix_strategy,
        "interleave_probs": data_args.interleave_probs,
        "seed": training_args.seed,
        "per_device_train_batch_size": settings.per_device_batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "world_size": inputs.data_parallel * inputs.sequence_parallel,
        "sequence_parallel_size": inputs.sequence_parallel,
        "data_parallel_size": inputs.data_parallel,
        "sequences_per_step": settings.per_device_batch_size
        * settings.gradient_accumulation_steps
        * inputs.data_parallel,
        "preprocessing_batch_size": settings.batch_size,
        "preprocessing_num_workers": settings.num_proc,
        "max_steps": training_args.max_steps,
        "num_train_epochs": training_args.num_train_epochs,
        "total_steps": total_optimizer_steps(
            mixture.steps_per_epoch, training_args.num_train_epochs, training_args.max_steps
        ),
    }
    lengths = {m.name: [length for length in m.rows.full_lengths if length is not None] for m in measured}
    return InspectReport(inputs.config_path, report_settings, reports, mixture, lengths)


def inspect_training_data(
    config_path: str, max_rows: int | None = None, world_size: int | None = None, show_progress: bool = True
) -> InspectReport:
    """Builds the report for a training YAML (see the module docstring): load, measure, mix, report.

    ``world_size`` is the number of training processes (GPUs); it defaults to one sequence-parallel
    group (``sequence_parallel_size`` from the YAML, else 1).
    """
    inputs = load_inputs(config_path, max_rows, world_size)
    measured = measure_datasets(inputs, show_progress)
    return report(inputs, measured, mix(measured, inputs))
