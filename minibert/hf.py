"""Hugging Face BERT, ALBERT and DistilBERT checkpoints in and out, without torch.

``model_type`` "albert" in ``config.json`` reads as an
:class:`~minibert.albert.AlbertConfig` (keys under ``albert.``, ``predictions.``,
``sop_classifier.``); an ALBERT model writes ``model_type`` "albert" (see
:func:`config_from_hf` / :func:`albert_config_to_hf`). ``model_type`` "distilbert" reads
as a :class:`~minibert.distilbert.DistilBertConfig` (transformers' field names, keys under
``distilbert.``, ``vocab_transform.`` / ``vocab_layer_norm.`` / ``vocab_projector.``,
``pre_classifier.``) and is written back as such. Weights of another family than
config.json's ``model_type`` are one error naming that field (:func:`check_family`).

Import (:func:`load_hf_directory`): a directory as transformers writes it --
``config.json``, ``model.safetensors`` (read with the ``safetensors`` library's NumPy API),
``vocab.txt`` and optionally ``tokenizer_config.json`` (``do_lower_case`` ...). Keys are
normalised to minibert's names, which are HF's (``bert.embeddings.word_embeddings.weight``
...): a bare ``BertModel`` checkpoint (``embeddings.*``) gets the ``bert.`` prefix, the
old TensorFlow-converted ``LayerNorm.gamma`` / ``LayerNorm.beta`` become ``weight`` /
``bias``, and buffers (``position_ids``) are dropped.

``pytorch_model.bin`` (torch's zip pickle) is read when there is no ``model.safetensors``,
by :mod:`minibert.torchbin`, which does not import torch and whose unpickler only builds
dicts and arrays (no other code is reachable from the file).

Export (:func:`save_hf_directory`): ``config.json``, ``model.safetensors``, ``vocab.txt``
and ``tokenizer_config.json``, each written atomically, which
``transformers.AutoModel*.from_pretrained`` loads with the same outputs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .atomic import atomic_copy, atomic_write
from .albert import AlbertConfig
from .auto import CONFIG_CLASSES, config_class
from .distilbert import DistilBertConfig
from .modeling import BertConfig
from .torchbin import TorchBinError, declared_storage_bytes, load_torch_state_dict
from .untrusted import (UntrustedFileError, check_config_fields, check_finite, check_model_fits,
                        check_state_matches_config, check_weight_bytes, read_json_object,
                        safetensors_bytes, safetensors_header)

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
BIN_NAME = "pytorch_model.bin"
VOCAB_NAME = "vocab.txt"
TOKENIZER_CONFIG_NAME = "tokenizer_config.json"

# BertConfig fields that have the same name and meaning in transformers' BertConfig.
HF_CONFIG_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "hidden_act", "hidden_dropout_prob",
                    "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                    "initializer_range", "layer_norm_eps", "pad_token_id",
                    "position_embedding_type", "classifier_dropout")
# AlbertConfig fields with the same name and meaning in transformers' AlbertConfig.
ALBERT_HF_CONFIG_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
                           "num_hidden_groups", "num_attention_heads", "intermediate_size",
                           "inner_group_num", "hidden_act", "hidden_dropout_prob",
                           "attention_probs_dropout_prob", "max_position_embeddings",
                           "type_vocab_size", "initializer_range", "layer_norm_eps",
                           "classifier_dropout_prob", "pad_token_id", "position_embedding_type")
# DistilBertConfig fields (transformers' names) that config.json holds.
DISTILBERT_HF_CONFIG_FIELDS = ("vocab_size", "max_position_embeddings", "sinusoidal_pos_embds",
                               "n_layers", "n_heads", "dim", "hidden_dim", "dropout",
                               "attention_dropout", "activation", "initializer_range",
                               "qa_dropout", "seq_classif_dropout", "pad_token_id")
# config class -> its transformers config.json fields, and the encoder's key prefix
FAMILY_HF_FIELDS = {BertConfig: HF_CONFIG_FIELDS, AlbertConfig: ALBERT_HF_CONFIG_FIELDS,
                    DistilBertConfig: DISTILBERT_HF_CONFIG_FIELDS}
FAMILY_PREFIXES = {BertConfig: "bert.", AlbertConfig: "albert.",
                   DistilBertConfig: "distilbert."}
_HEAD_PREFIXES = ("bert.", "cls.", "classifier.", "qa_outputs.",
                  "albert.", "predictions.", "sop_classifier.",
                  "distilbert.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
                  "pre_classifier.")


class HFFormatError(ValueError):
    """A Hugging Face directory that minibert cannot read (missing file, unsupported
    architecture option, a weights file that cannot be read)."""


@dataclass
class HFCheckpoint:
    """What :func:`load_hf_directory` returns.

    config: the model's :class:`BertConfig`, or :class:`~minibert.albert.AlbertConfig` for
        model_type "albert" (num_labels from ``id2label`` if present).
    state: name -> NumPy array, minibert / HF ``BertFor*`` names (``bert.*``, ``cls.*``,
        ``classifier.*``, ``qa_outputs.*``; ALBERT's ``albert.*``, ``predictions.*``,
        ``sop_classifier.*``), dtype as stored (usually float32).
    vocab_file: path of ``vocab.txt``.
    tokenizer_options: keyword arguments for :class:`minibert.tokenization.BertTokenizer`
        (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``).
    id2label: {int: str} from config.json, or None.
    architectures: config.json's ``architectures`` (e.g. ``["BertForTokenClassification"]``),
        [] if absent.
    """

    config: BertConfig | AlbertConfig
    state: dict[str, np.ndarray]
    vocab_file: Path
    tokenizer_options: dict[str, Any] = field(default_factory=dict)
    id2label: dict[int, str] | None = None
    architectures: list[str] = field(default_factory=list)


def is_hf_directory(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory with a ``config.json`` whose ``model_type`` is
    ``"bert"`` (or that names a ``Bert*`` architecture), or with Hugging Face weights
    beside a ``config.json`` that is not a JSON object (:func:`load_hf_directory` then
    says what is wrong with it)."""
    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        return False
    try:
        d = read_json_object(path / CONFIG_NAME)
    except (OSError, ValueError):
        return any((path / n).is_file() for n in (SAFETENSORS_NAME, BIN_NAME))
    archs = d.get("architectures")
    model_type = d.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_CLASSES:
        return True
    return isinstance(archs, list) and any(str(a).startswith(("Bert", "Albert")) for a in archs)


def config_from_hf(d: dict[str, Any], source: str = "config.json"):
    """A :class:`BertConfig` from a transformers BERT ``config.json`` dict, or an
    :class:`~minibert.albert.AlbertConfig` for ``model_type`` "albert" (fields it leaves
    out take transformers' defaults, which are the config classes').

    Raises:
        HFFormatError: a model type other than bert / albert, an option minibert does not
            implement (``position_embedding_type`` relative_key*, an unknown
            ``hidden_act``), or an invalid value (the config's error, naming the field,
            prefixed with ``source``).
    """
    try:
        cls = config_class(d.get("model_type", "bert"))
    except ValueError as e:
        raise HFFormatError(f"{source}: {e}") from None
    fields = FAMILY_HF_FIELDS.get(cls, HF_CONFIG_FIELDS)
    kw = {k: d[k] for k in fields if k in d}
    if kw.get("position_embedding_type", "absolute") != "absolute":
        raise HFFormatError(f"{source}: position_embedding_type "
                            f"{kw['position_embedding_type']!r} is not supported "
                            "(minibert has 'absolute' only for HF checkpoints)")
    if "id2label" in d:
        kw["num_labels"] = len(d["id2label"])
    elif "num_labels" in d:
        kw["num_labels"] = int(d["num_labels"])
    try:
        return cls(**kw)
    except (TypeError, ValueError) as e:
        raise HFFormatError(f"{source}: {e}") from e


def albert_config_to_hf(config: AlbertConfig, architecture: str) -> dict[str, Any]:
    """The transformers ``config.json`` fields of an ALBERT ``config`` (``model_type``
    "albert"), without the labels.

    Raises:
        HFFormatError: sinusoidal positions or a mean-pooled sequence classifier, which
            transformers' ALBERT does not have.
    """
    if config.position_embedding_type != "absolute" or (
            config.classifier_pooling != "cls"
            and architecture == "AlbertForSequenceClassification"):
        raise HFFormatError("cannot export to Hugging Face ALBERT: position_embedding_type="
                            f"{config.position_embedding_type!r}, classifier_pooling="
                            f"{config.classifier_pooling!r} (HF ALBERT has learned absolute "
                            "positions and a classifier on the pooled [CLS] vector)")
    d: dict[str, Any] = {"architectures": [architecture], "model_type": "albert"}
    d.update({k: getattr(config, k) for k in ALBERT_HF_CONFIG_FIELDS})
    return d


def config_to_hf(config: BertConfig | AlbertConfig, architecture: str,
                 id2label: dict[int, str] | None = None) -> dict[str, Any]:
    """The transformers ``config.json`` dict for ``config``.

    Raises:
        HFFormatError: options transformers' BERT (ALBERT) does not have (pre-LN,
            sinusoidal positions, a mean-pooled sequence classifier), which a HF directory
            could not represent.
    """
    if isinstance(config, AlbertConfig):
        return _with_labels(albert_config_to_hf(config, architecture), config, id2label)
    if isinstance(config, DistilBertConfig):
        d = {"architectures": [architecture], "model_type": "distilbert"}
        d.update({k: getattr(config, k) for k in DISTILBERT_HF_CONFIG_FIELDS})
        return _with_labels(d, config, id2label)
    if config.norm_position != "post" or config.position_embedding_type != "absolute":
        raise HFFormatError("cannot export to Hugging Face BERT: norm_position="
                            f"{config.norm_position!r}, position_embedding_type="
                            f"{config.position_embedding_type!r} (HF BERT is post-LN with "
                            "learned absolute positions)")
    if config.classifier_pooling != "cls" and architecture == "BertForSequenceClassification":
        raise HFFormatError("cannot export to Hugging Face BERT: classifier_pooling="
                            f"{config.classifier_pooling!r} (transformers' "
                            "BertForSequenceClassification reads the pooled [CLS] vector)")
    d: dict[str, Any] = {"architectures": [architecture], "model_type": "bert"}
    d.update({k: getattr(config, k) for k in HF_CONFIG_FIELDS})
    return _with_labels(d, config, id2label)


def _with_labels(d: dict[str, Any], config, id2label: dict[int, str] | None) -> dict[str, Any]:
    """``d`` with ``id2label`` / ``label2id`` (default names LABEL_i for num_labels)."""
    if id2label is None:
        id2label = {i: f"LABEL_{i}" for i in range(config.num_labels)}
    d["id2label"] = {str(i): str(v) for i, v in sorted(id2label.items())}
    d["label2id"] = {str(v): int(i) for i, v in sorted(id2label.items())}
    return d


def normalize_state_dict(raw: dict[str, np.ndarray],
                         base_prefix: str = "bert.") -> dict[str, np.ndarray]:
    """HF checkpoint keys -> minibert names: add ``base_prefix`` (``bert.``, ``albert.``)
    to bare encoder keys, rename ``gamma``/``beta`` to ``weight``/``bias``, drop
    ``*.position_ids`` buffers."""
    out = {}
    for k, v in raw.items():
        if k.endswith("position_ids"):
            continue
        k = k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                     "LayerNorm.bias")
        if not k.startswith(_HEAD_PREFIXES):
            k = base_prefix + k
        out[k] = np.asarray(v)
    return out


def read_hf_weights(directory: str | os.PathLike, config: BertConfig) -> dict[str, np.ndarray]:
    """The raw tensors of ``directory/model.safetensors``, else of
    ``directory/pytorch_model.bin``, as NumPy arrays (HF key names), each file's header
    checked first (:func:`minibert.untrusted.safetensors_header`; the zip directory of a
    ``.bin``) and its declared bytes against what ``config`` implies
    (:func:`~minibert.untrusted.check_weight_bytes`), before any tensor is read.

    Raises:
        HFFormatError: neither file, a sharded checkpoint, or a file that cannot be read.
        UntrustedFileError: a header that fails a check, or more bytes than the config
            or the memory allows.
    """
    directory = Path(directory)
    st = directory / SAFETENSORS_NAME
    if not st.is_file():
        if (directory / BIN_NAME).is_file():
            try:
                check_weight_bytes(declared_storage_bytes(directory / BIN_NAME), config,
                                   directory / BIN_NAME)
                return load_torch_state_dict(directory / BIN_NAME)
            except (TorchBinError, OSError) as e:
                raise HFFormatError(f"{directory / BIN_NAME}: cannot be read ({e})") from e
        if any((directory / (n + ".index.json")).is_file() for n in (SAFETENSORS_NAME, BIN_NAME)):
            raise HFFormatError(f"{directory}: sharded checkpoints are not supported "
                                "(BERT-sized models fit in one file)")
        raise HFFormatError(f"{directory}: no {SAFETENSORS_NAME} or {BIN_NAME}")
    check_weight_bytes(safetensors_bytes(safetensors_header(st)), config, st)
    from safetensors.numpy import load_file
    try:
        return load_file(str(st))
    except Exception as e:  # the library raises several types
        raise HFFormatError(f"{st}: cannot be read by safetensors ({e})") from e


def read_tokenizer_options(directory: Path) -> dict[str, Any]:
    """BertTokenizer options from ``tokenizer_config.json`` when present (default:
    lower-case): ``do_lower_case``, ``tokenize_chinese_chars`` and
    ``clean_up_tokenization_spaces`` booleans, ``strip_accents`` a boolean or null.

    Raises:
        UntrustedFileError: the file is not a JSON object, or an option of another type.
    """
    opts: dict[str, Any] = {"do_lower_case": True}
    tc = directory / TOKENIZER_CONFIG_NAME
    if tc.is_file():
        t = read_json_object(tc)
        for k in ("do_lower_case", "strip_accents", "tokenize_chinese_chars",
                  "clean_up_tokenization_spaces"):
            if k not in t:
                continue
            if not (isinstance(t[k], bool) or (k == "strip_accents" and t[k] is None)):
                raise UntrustedFileError(f"{tc}: field {k!r} is {t[k]!r:.40}, expected true or "
                                         "false" + (" or null" if k == "strip_accents" else ""))
            opts[k] = t[k]
    return opts


def load_hf_directory(directory: str | os.PathLike) -> HFCheckpoint:
    """Read a Hugging Face BERT directory (see the module docstring), checking each file
    before memory is spent on it (:mod:`minibert.untrusted`): config.json's fields and
    the size of the model they imply, vocab.txt's length against ``vocab_size``,
    tokenizer_config.json's options, the weights file's header and declared bytes; then
    that the weights have the config's shapes and are finite.

    Returns:
        :class:`HFCheckpoint`; load ``state`` into a model with
        :func:`load_pretrained_weights`.
    Raises:
        HFFormatError: missing config.json / vocab.txt / weights, an unsupported option.
        UntrustedFileError: a file that fails a check (the message names the file, the
            field or tensor, and what was expected).
        VocabError: a vocab.txt that is not UTF-8, empty, or repeats a token.
    """
    directory = Path(directory)
    cfg_path = directory / CONFIG_NAME
    if not cfg_path.is_file():
        raise HFFormatError(f"{directory}: no {CONFIG_NAME}, not a Hugging Face model directory")
    d = read_json_object(cfg_path)
    check_config_fields(d, str(cfg_path))
    config = config_from_hf(d, str(cfg_path))
    check_model_fits(config, str(cfg_path))
    vocab = directory / VOCAB_NAME
    if not vocab.is_file():
        raise HFFormatError(f"{directory}: no {VOCAB_NAME} (a WordPiece vocabulary is needed)")
    from .tokenization.vocab import check_vocab_fits   # the tokenizer package, when it is needed
    check_vocab_fits(vocab, config.vocab_size, str(cfg_path))
    tok_opts = read_tokenizer_options(directory)
    id2label = ({int(k): str(v) for k, v in d["id2label"].items()} if "id2label" in d
                else None)
    state = normalize_state_dict(read_hf_weights(directory, config),
                                 FAMILY_PREFIXES.get(type(config), "bert."))
    weights = next(directory / n for n in (SAFETENSORS_NAME, BIN_NAME)
                   if (directory / n).is_file())
    check_family(state, config, f"{weights} and {cfg_path.name}")
    check_state_matches_config(state, config, f"{weights} and {cfg_path.name}")
    check_finite(state, str(weights))
    archs = [str(a) for a in d.get("architectures") or []]
    return HFCheckpoint(config, state, vocab, tok_opts, id2label, archs)


# a piece of key that only one family's encoder has (a bare encoder's keys get the
# config's prefix, so the prefix alone cannot tell the family of a bare checkpoint)
FAMILY_MARKERS = {BertConfig: ".encoder.layer.", AlbertConfig: ".albert_layer_groups.",
                  DistilBertConfig: ".transformer.layer."}


def check_family(state: dict[str, np.ndarray], config, source: str) -> None:
    """Refuse weights of another model family than ``config``'s: none under the config's
    encoder prefix (:data:`FAMILY_PREFIXES`, e.g. ``distilbert.``) and some under another
    family's, or encoder layers named as another family names them
    (:data:`FAMILY_MARKERS`: ``encoder.layer.`` for BERT, ``transformer.layer.`` for
    DistilBERT ...) and none as the config's family does.

    Raises:
        HFFormatError: one line naming ``model_type``, the config's family and the one the
            weights belong to.
    """
    own = FAMILY_PREFIXES.get(type(config), "bert.")
    other = None
    if not any(k.startswith(own) for k in state):
        other = next((cls for cls, p in FAMILY_PREFIXES.items()
                      if p != own and any(k.startswith(p) for k in state)), None)
    mark = FAMILY_MARKERS.get(type(config), ".encoder.layer.")
    if other is None and not any(mark in k for k in state):
        other = next((cls for cls, m in FAMILY_MARKERS.items()
                      if m != mark and any(m in k for k in state)), None)
    if other is not None:
        raise HFFormatError(f"{source}: field model_type is {config.model_type!r} but the "
                            f"weights are a {other.model_type!r} model's (keys "
                            f"*{FAMILY_MARKERS[other]}*); set "
                            f"model_type to {other.model_type!r} or use that model's "
                            "config.json")


def load_pretrained_weights(model, state: dict[str, np.ndarray],
                            source: str = "checkpoint") -> dict[str, list[str]]:
    """Copy every tensor of ``state`` whose name and shape fit ``model``; the rest of the
    model keeps its initialisation (e.g. a new classification head).

    Args:
        model: a minibert Module (names ``bert.*`` ..., or ``albert.*`` ... for ALBERT:
            the encoder prefix is the model's ``base_model_prefix``).
        state: name -> array, already normalised (:func:`normalize_state_dict`).
    Returns:
        {"loaded": [...], "new": [...] (model parameters not in state, or whose shape
        differs), "unused": [...] (state keys the model does not have)}.
    Raises:
        HFFormatError: the encoder itself (``bert.*`` except the pooler) is missing or has
            other shapes, or the state holds encoder tensors the model lacks (more layers
            than the config says): the checkpoint does not match the config. Unused head
            tensors (``cls.*``, ``classifier.*``, ``qa_outputs.*``, the pooler) are only
            reported.
    """
    params = dict(model._named_parameters_all())
    core = getattr(model, "base_model_prefix", "bert") + "."
    if not any(k.startswith(core) for k in params):  # a bare encoder
        state = {k: v for k, v in state.items() if k.startswith(core)}
        params = {core + k: p for k, p in params.items()}
        return _load_fitting(model, params, state, source, core, prefix=core)
    return _load_fitting(model, params, state, source, core)


def _load_fitting(model, params, state, source, core="bert.", prefix=""):
    fits = {k: v for k, v in state.items() if k in params and tuple(v.shape) == params[k].shape}
    misfit = sorted(k for k in state if k in params and k not in fits)
    core_missing = sorted(k for k in params if k.startswith(core) and "pooler" not in k
                          and k not in fits)
    if core_missing:
        detail = "; ".join(f"{k}: checkpoint {tuple(state[k].shape)} vs model "
                           f"{params[k].shape}" for k in misfit if k in core_missing)
        raise HFFormatError(f"{source}: encoder weights missing or mis-shaped: "
                            f"{core_missing[:8]}{' ...' if len(core_missing) > 8 else ''}"
                            + (f" ({detail})" if detail else ""))
    # encoder tensors the model has no place for: the config and the weights disagree
    # (e.g. config.json says fewer layers than the file holds)
    core_unused = sorted(k for k in state if k.startswith(core) and "pooler" not in k
                         and k not in params)
    if core_unused:
        raise HFFormatError(f"{source}: the weights hold encoder tensors the config has no "
                            f"place for: {core_unused[:8]}"
                            f"{' ...' if len(core_unused) > 8 else ''} ({len(core_unused)} in "
                            "all); check num_hidden_layers and the other sizes in its config")
    model.load_state_dict({k[len(prefix):]: v for k, v in fits.items()}, strict=False)
    given = {id(params[k]) for k in fits}
    return {"loaded": sorted(fits),
            "new": sorted(k for k, p in params.items() if id(p) not in given),
            "unused": sorted(set(state) - set(fits))}


def save_hf_directory(model, directory: str | os.PathLike, vocab_file: str | os.PathLike,
                      id2label: dict[int, str] | None = None,
                      tokenizer_options: dict[str, Any] | None = None) -> Path:
    """Write ``model`` as a Hugging Face directory that transformers loads.

    Files (each written atomically): ``config.json`` (``architectures`` = the model's
    class name, HF field names, ``id2label``/``label2id``), ``model.safetensors`` (float32
    or the model's dtype; tied weights stored once, under their first name, as
    transformers does), ``vocab.txt`` (a copy) and ``tokenizer_config.json``.

    Args:
        model: BertModel, BertForPreTraining, BertForSequenceClassification,
            BertForTokenClassification or BertForQuestionAnswering, or the Albert* class
            of each.
        directory: created if needed.
        vocab_file: the WordPiece vocabulary the model was trained with.
        id2label: class names for classification models (tags for token classification).
        tokenizer_options: ``do_lower_case`` etc. (default: lower-case).
    Returns:
        the directory.
    Raises:
        HFFormatError: a config HF BERT (ALBERT) cannot express (see
            :func:`config_to_hf`).
    """
    from safetensors.numpy import save as st_save
    from .backend import to_numpy

    directory = Path(directory)
    arch = type(model).__name__
    cfg = config_to_hf(model.config, arch, id2label)
    tensors = {name: np.ascontiguousarray(to_numpy(p.data))
               for name, p in model.named_parameters()}
    directory.mkdir(parents=True, exist_ok=True)
    blob = st_save(tensors, metadata={"format": "pt"})
    atomic_write(directory / SAFETENSORS_NAME, lambda f: f.write(blob))
    atomic_write(directory / CONFIG_NAME,
                 lambda f: f.write(json.dumps(cfg, indent=2).encode("utf-8")))
    tok = {"tokenizer_class": "BertTokenizer", "do_lower_case": True,
           "model_max_length": model.config.max_position_embeddings,
           "clean_up_tokenization_spaces": True}     # our decode's default (transformers 5: False)
    tok.update(tokenizer_options or {})
    atomic_write(directory / TOKENIZER_CONFIG_NAME,
                 lambda f: f.write(json.dumps(tok, indent=2).encode("utf-8")))
    atomic_copy(vocab_file, directory / VOCAB_NAME)
    return directory
