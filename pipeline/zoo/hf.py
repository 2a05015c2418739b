"""``model=hf``: any transformers model class, built from its config class with random weights.

The inputs come from the model's own ``forward`` and config: token ids in the vocabulary's range,
an attention mask with padding, token type ids where the model embeds them, and decoder ids for
encoder-decoder models, each with its length in dimension 1 (``seq_dim``, routed at ``model.seq_lens``)
and its pad value (the config's ``pad_token_id`` for ids, 0 for masks and token types); pixels at the
config's image size; mel features (Whisper) or raw audio (``input_values``). Outputs stay as the model
returns them (``ModelOutput`` fields by name). Caches that make an output depend on earlier calls are off
unless ``model.hf.use_cache=true``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Dict, Mapping

from torch import nn

from pipeline.errors import ConfigError
from pipeline.zoo import close_to, require

EXAMPLE = "e.g. model.hf.model_class=BertForQuestionAnswering"


def transformers_module() -> Any:
    return require("transformers", "hf", "model=hf")


def model_class(name: str) -> type:
    """A transformers model class by its top-level name, or by its module path inside transformers
    (``models.whisper.modeling_whisper.WhisperEncoder``) for classes transformers does not export."""
    transformers = transformers_module()
    module_path, _, attr = name.rpartition(".")
    try:
        module = importlib.import_module(f"transformers.{module_path}") if module_path else transformers
        cls = getattr(module, attr)
    except (ImportError, AttributeError):
        names = [n for n in dir(transformers) if n[:1].isupper()]
        raise ConfigError(f"model.hf.model_class={name}: transformers {transformers.__version__} has no such class"
                          f"{close_to(attr, names)}; {EXAMPLE}") from None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ConfigError(f"model.hf.model_class={name} is not a transformers model class (a PreTrainedModel); "
                          f"{EXAMPLE}")
    return cls


def config_of(cls: type, hf: Mapping[str, Any]) -> Any:
    """The model's config: its config class with ``model.hf.config``'s keywords, and ``use_cache`` set."""
    config_class, given = cls.config_class, dict(hf.get("config") or {})
    default = config_class()
    known = {n for n in dir(default) if not n.startswith("_")} | set(getattr(config_class, "attribute_map", {}))
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(f"model.hf.config: {config_class.__name__} has no {unknown[0]!r}"
                          f"{close_to(unknown[0], default.to_dict())}; its keys are those of "
                          f"{config_class.__name__}().to_dict()")
    config = config_class(**given)
    if hasattr(config, "use_cache"):
        config.use_cache = bool(hf.get("use_cache", False))
    return config


def build(hf: Mapping[str, Any]) -> nn.Module:
    """The model of ``model.hf`` with random weights (Hydra calls this through ``model.build``)."""
    cls = model_class(str(hf["model_class"]))
    return cls(config_of(cls, hf))


def image_size(config: Any) -> list:
    size = getattr(config, "image_size", 224)
    return [int(s) for s in size] if isinstance(size, (list, tuple)) else [int(size)] * 2


def inputs(hf: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """``model.inputs`` for the model of ``model.hf``, from its ``forward`` parameters and its config."""
    cls = model_class(str(hf["model_class"]))
    config = config_of(cls, hf)
    params = inspect.signature(cls.forward).parameters
    seq = int(hf.get("seq_len", 128))
    positions = getattr(config, "max_position_embeddings", None)
    if "input_ids" in params and isinstance(positions, int) and not 1 <= seq <= positions:
        raise ConfigError(f"model.hf.seq_len={seq}: {cls.__name__} embeds at most {positions} positions "
                          f"(max_position_embeddings); use model.hf.seq_len={min(max(seq, 1), positions)}, or give the "
                          f"model more: '+model.hf.config={{max_position_embeddings: {max(seq, 1)}}}'")
    if "input_ids" in params:
        if not getattr(config, "vocab_size", None):
            raise ConfigError(f"{cls.__name__}'s config has no vocab_size to draw input_ids from; give model.inputs")
        pad_id = getattr(config, "pad_token_id", None)
        ids = {"shape": [seq], "dtype": "int64", "fill": "randint", "high": int(config.vocab_size), "seq_dim": 1,
               "pad": int(pad_id) if isinstance(pad_id, int) and 0 <= pad_id < config.vocab_size else 0}
        spec = {"input_ids": ids}
        if "attention_mask" in params:
            spec["attention_mask"] = {"shape": [seq], "dtype": "int64", "fill": "mask", "seq_dim": 1, "pad": 0}
        if "token_type_ids" in params and getattr(config, "type_vocab_size", 0):
            spec["token_type_ids"] = {"shape": [seq], "dtype": "int64", "fill": "randint",
                                      "high": int(config.type_vocab_size), "seq_dim": 1, "pad": 0}
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            spec["decoder_input_ids"] = dict(ids)
        return spec
    if "pixel_values" in params:
        return {"pixel_values": {"shape": [int(getattr(config, "num_channels", 3)), *image_size(config)],
                                 "dtype": "float32"}}
    if "input_features" in params and hasattr(config, "num_mel_bins") and hasattr(config, "max_source_positions"):
        # Whisper's encoder takes exactly two frames per position (its second convolution has stride 2).
        return {"input_features": {"shape": [int(config.num_mel_bins), 2 * int(config.max_source_positions)],
                                   "dtype": "float32"}}
    if "input_values" in params:
        return {"input_values": {"shape": [int(hf.get("samples", 16000))], "dtype": "float32"}}
    takes = [n for n in params if n not in ("self", "kwargs")][:6]
    raise ConfigError(f"cannot derive the inputs of {cls.__name__} (forward takes {takes}, ...); give them in "
                      f"model.inputs, e.g. '+model.inputs.{takes[0] if takes else 'x'}={{shape: [128], dtype: int64}}'")
