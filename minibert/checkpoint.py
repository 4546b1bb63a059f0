"""Checkpoints: one ``.npz`` file holding the model, the optimizer and the run's state.

Layout of the archive (NumPy ``.npz``, no pickles):
    ``model/<name>``  parameter arrays under their HF names (tied names included);
    ``optim/<key>``   AdamW moments and step count (``AdamW.state_dict``);
    ``train/<name>``  only with a weight average (``--ema-decay``): the raw training
                      weights, which a resumed run trains on; ``model/`` then holds the
                      average, cast to the model's dtype, so every tool that reads the
                      checkpoint gets it;
    ``ema/<name>``    only with a weight average: the average itself, at its own precision
                      (:meth:`minibert.averaging.WeightAverage.state_dict`);
    ``meta``          UTF-8 JSON: {"format", "config", "trainer"} as a uint8 array; "config"
                      holds the config's fields and its ``model_type`` ("bert" when absent,
                      as in checkpoints written before ALBERT), so an ALBERT checkpoint
                      loads as an AlbertConfig (:func:`minibert.auto.config_from_dict`).

Files are written atomically (:mod:`minibert.atomic`), so a crash mid-write never damages
the last good checkpoint. Pre-LN checkpoints written before the pre-LN LayerNorms took
Megatron-BERT's names load through :func:`rename_old_pre_ln_keys`.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_write
from .auto import config_from_dict
from .modeling import ModelConfig
from .untrusted import (UntrustedFileError, check_config_fields, check_finite,
                         check_model_fits, check_npz_members, check_state_matches_config,
                         check_weight_bytes)

FORMAT = "minibert-checkpoint-1"

# a pre-LN LayerNorm under its old name: the one before self-attention was kept in
# attention.output, the one before the feed-forward block in the layer's output
_OLD_PRE_LN = re.compile(r"(^|\.)encoder\.layer\.(\d+)\.(attention\.)?output\.LayerNorm\.")


# the most a checkpoint stores per parameter: float64 weights, AdamW's two moments and,
# with a weight average, the raw weights and the average (float16 runs: float32 master
# weights instead of larger weights)
CHECKPOINT_BYTES_PER_PARAMETER = 40


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit the model it is loaded into."""


def save_checkpoint(path: str | os.PathLike, model, optimizer=None,
                    trainer_state: dict[str, Any] | None = None, ema=None) -> Path:
    """Write ``model`` (its config and state_dict), ``optimizer`` (if given) and a JSON-able
    ``trainer_state`` to ``path`` atomically; with ``ema`` (a
    :class:`~minibert.averaging.WeightAverage`) the average as ``model/`` and the raw
    weights as ``train/`` (see the module docstring). Returns the path written."""
    arrays = {"model/" + k: v for k, v in model.state_dict().items()}
    if ema is not None:
        with ema.swapped_in():
            averaged = model.state_dict()
        arrays = {**{"train/" + k[6:]: v for k, v in arrays.items()},
                  **{"model/" + k: v for k, v in averaged.items()},
                  **{"ema/" + k: v for k, v in ema.state_dict().items()}}
    if optimizer is not None:
        arrays.update({"optim/" + k: v for k, v in optimizer.state_dict().items()})
    meta = {"format": FORMAT, "config": model.config.to_record(),
            "trainer": trainer_state or {}}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def rewrite_checkpoint(src: str | os.PathLike, dst: str | os.PathLike,
                       trainer_state: dict[str, Any]) -> Path:
    """Write the arrays of the checkpoint ``src`` (read with :func:`load_checkpoint`
    before, so known to be sound) to ``dst``, atomically, with ``trainer_state`` as its
    trainer record. Returns the path written."""
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    meta["trainer"] = trainer_state
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    return atomic_write(dst, lambda f: np.savez(f, **arrays))


def load_checkpoint(path: str | os.PathLike, arrays: bool = True) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`, checking it before its arrays
    are read: every member's size against its header and the memory available
    (:func:`minibert.untrusted.check_npz_members`), the config's fields and size
    (:func:`~minibert.untrusted.check_config_fields`,
    :func:`~minibert.untrusted.check_model_fits`), the members' bytes against what the
    config implies (:func:`~minibert.untrusted.check_weight_bytes`); then that the
    model's weights have the config's shapes and are
    finite (:func:`~minibert.untrusted.check_finite`).

    Args:
        arrays: also read the model and optimizer arrays; False reads only the small
            "meta" entry (config and trainer record), e.g. to see whose run it is.
    Returns:
        {"config": BertConfig or AlbertConfig, "model": {name: array}, "optim": {key: array},
         "train": {name: array}, "ema": {name: array}, "trainer": dict} (the array dicts
        empty when ``arrays`` is False; "train" and "ema" empty without a weight average).
    Raises:
        CheckpointError: missing file, not a minibert checkpoint, a damaged archive, a
            member or config that fails a check, non-finite weights (the message names
            the file and the member, field or tensor).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: no such file")
    try:
        declared = check_npz_members(path)
        with np.load(path, allow_pickle=False) as z:
            if "meta" not in z.files:
                raise CheckpointError(f"checkpoint {path}: no 'meta' entry, not a minibert "
                                      "checkpoint")
            config, trainer = _read_meta(z["meta"], path)
            if arrays:
                check_weight_bytes(declared, config, path, CHECKPOINT_BYTES_PER_PARAMETER)
            files = {k: z[k] for k in z.files if arrays and k != "meta"}
    except CheckpointError:
        raise
    except UntrustedFileError as e:
        raise CheckpointError(f"checkpoint {e}") from None
    except Exception as e:
        raise CheckpointError(f"checkpoint {path}: cannot be read as .npz ({e})") from e
    model, optim, train, ema = ({k[len(g):]: v for k, v in files.items() if k.startswith(g)}
                                for g in ("model/", "optim/", "train/", "ema/"))
    try:
        for weights in (model, train) if train else (model,):
            check_state_matches_config(weights, config, str(path))
            check_finite(weights, str(path))
    except UntrustedFileError as e:
        raise CheckpointError(f"checkpoint {e}") from None
    if getattr(config, "norm_position", "post") == "pre":
        model, optim = rename_old_pre_ln_keys(model), rename_old_pre_ln_keys(optim)
    return {"config": config, "model": model, "optim": optim, "train": train, "ema": ema,
            "trainer": trainer}


def _read_meta(meta: np.ndarray, path: Path) -> tuple[ModelConfig, dict[str, Any]]:
    """The config (checked, before any weight is read) and trainer record of the "meta"
    entry. Raises CheckpointError."""
    try:
        meta = json.loads(meta.tobytes().decode("utf-8"))
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path}: format {meta.get('format')!r}, "
                                  f"expected {FORMAT!r}")
        check_config_fields(meta["config"], f"{path} (meta config)")
        config = config_from_dict(meta["config"])
        check_model_fits(config, f"{path} (meta config)")
        trainer = dict(meta.get("trainer") or {})
    except (CheckpointError, UntrustedFileError):
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CheckpointError(f"checkpoint {path}: damaged 'meta' entry ({e})") from None
    return config, trainer


def rename_old_pre_ln_keys(state: dict[str, Any]) -> dict[str, Any]:
    """A pre-LN model's state under the names of :mod:`minibert.modeling`, whose pre-LN
    LayerNorms are named by what they normalise (Hugging Face's Megatron-BERT), from a
    state saved before that with the post-LN names:

        ...encoder.layer.N.attention.output.LayerNorm.*  ->  ...encoder.layer.N.attention.ln.*
        ...encoder.layer.N.output.LayerNorm.*            ->  ...encoder.layer.N.ln.*

    Keys may carry a prefix (``bert.``, or the optimizer's ``m.`` / ``v.`` / ``master.``);
    every other key, and a key already new, is kept as it is, so the map may run on any
    pre-LN state. Never apply it to a post-LN state, where those names are HF's and right.
    Returns a new dict with the same values."""
    return {_OLD_PRE_LN.sub(r"\1encoder.layer.\2.\3ln.", k): v for k, v in state.items()}


def check_same_config(saved: ModelConfig, current: ModelConfig, source: str) -> None:
    """Raise CheckpointError naming the model_type when ``saved`` and ``current`` are of
    two families (BERT and ALBERT), else listing every field where they differ."""
    if saved.model_type != current.model_type:
        raise CheckpointError(f"checkpoint {source} holds a model of model_type "
                              f"{saved.model_type!r}; this run builds {current.model_type!r}")
    diffs = [f"{k}: checkpoint has {v!r}, this run has {current.to_dict()[k]!r}"
             for k, v in saved.to_dict().items() if current.to_dict()[k] != v]
    if diffs:
        raise CheckpointError(f"checkpoint {source} was made with another model config: "
                              + "; ".join(diffs))
