"""LLaMA-Factory's own data pipeline as the data tests call it: arguments parsed from a dict as from a YAML,
LLaMA-Factory's template, then ``get_dataset`` for one stage."""

from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments
from transformers import HfArgumentParser


def load_with_llamafactory(values, stage, tokenizer_module=None):
    """``(dataset module, template, tokenizer module)`` for ``stage`` from the arguments ``values`` (the cache
    off, no reporting); the tokenizer is loaded from ``model_name_or_path`` unless ``tokenizer_module`` is given."""
    from llamafactory.model import load_tokenizer

    parser = HfArgumentParser([ModelArguments, DataArguments, TrainingArguments, FinetuningArguments])
    model_args, data_args, training_args, _ = parser.parse_dict(
        {"overwrite_cache": True, "report_to": "none", **values}
    )
    if tokenizer_module is None:
        tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    dataset_module = get_dataset(template, model_args, data_args, training_args, stage, **tokenizer_module)
    return dataset_module, template, tokenizer_module
