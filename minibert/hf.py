"""Hugging Face BERT, ALBERT, DistilBERT and ELECTRA checkpoints in and out, without torch.

``model_type`` "albert" in ``config.json`` reads as an
:class:`~minibert.albert.AlbertConfig` (keys under ``albert.``, ``predictions.``,
``sop_classifier.``); an ALBERT model writes ``model_type`` "albert" (see
:func:`config_from_hf` / :func:`albert_config_to_hf`). ``model_type`` "distilbert" reads
as a :class:`~minibert.distilbert.DistilBertConfig` (transformers' field names, keys under
``distilbert.``, ``vocab_transform.`` / ``vocab_layer_norm.`` / ``vocab_projector.``,
``pre_classifier.``) and is written back as such; ``model_type`` "electra" as an
:class:`~minibert.electra.ElectraConfig` (keys under ``electra.``,
``discriminator_predictions.``, ``generator_predictions.``, ``generator_lm_head.``).
Weights of another family than config.json's ``model_type`` are one error naming that
field (:func:`check_family`).

Import (:func:`load_hf_directory`): a directory as transformers writes it --
``config.json``, ``model.safetensors`` (read by :func:`read_safetensors`: float32, float16
and bfloat16 weights, the last widened exactly to float32; the model casts to its dtype),
``vocab.txt`` -- or, without it, a WordPiece ``tokenizer.json`` (:func:`read_tokenizer_json`;
BPE and Unigram tokenizers are refused) -- and optionally ``tokenizer_config.json``
(``do_lower_case`` ...). Keys are
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
from .electra import ElectraConfig
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
# ElectraConfig fields with the same name and meaning in transformers' ElectraConfig.
ELECTRA_HF_CONFIG_FIELDS = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
                            "num_attention_heads", "intermediate_size", "hidden_act",
                            "hidden_dropout_prob", "attention_probs_dropout_prob",
                            "max_position_embeddings", "type_vocab_size", "initializer_range",
                            "layer_norm_eps", "summary_type", "summary_use_proj",
                            "summary_activation", "summary_last_dropout", "pad_token_id",
                            "classifier_dropout", "position_embedding_type")
# DistilBertConfig fields (transformers' names) that config.json holds.
DISTILBERT_HF_CONFIG_FIELDS = ("vocab_size", "max_position_embeddings", "sinusoidal_pos_embds",
                               "n_layers", "n_heads", "dim", "hidden_dim", "dropout",
                               "attention_dropout", "activation", "initializer_range",
                               "qa_dropout", "seq_classif_dropout", "pad_token_id")
# config class -> its transformers config.json fields, and the encoder's key prefix
# (transformers' base_model_prefix)
FAMILY_HF_FIELDS = {BertConfig: HF_CONFIG_FIELDS, AlbertConfig: ALBERT_HF_CONFIG_FIELDS,
                    DistilBertConfig: DISTILBERT_HF_CONFIG_FIELDS,
                    ElectraConfig: ELECTRA_HF_CONFIG_FIELDS}
FAMILY_PREFIXES = {BertConfig: "bert.", AlbertConfig: "albert.",
                   DistilBertConfig: "distilbert.", ElectraConfig: "electra."}
_HEAD_PREFIXES = ("bert.", "cls.", "classifier.", "qa_outputs.",
                  "albert.", "predictions.", "sop_classifier.",
                  "distilbert.", "vocab_transform.", "vocab_layer_norm.", "vocab_projector.",
                  "pre_classifier.",
                  "electra.", "discriminator_predictions.", "generator_predictions.",
                  "generator_lm_head.")


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
        ``sop_classifier.*``), float32 for float32, float16 and bfloat16 files (widened
        exactly), float64 as stored.
    vocab_file: path of ``vocab.txt`` (for a tokenizer.json-only directory, the vocab.txt
        written from it: :func:`vocab_of_directory`).
    tokenizer_options: keyword arguments for :class:`minibert.tokenization.BertTokenizer`
        (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``,
        ``model_max_length`` when a tokenizer file sets one).
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
    return isinstance(archs, list) and any(str(a).startswith(("Bert", "Albert", "Electra"))
                                           for a in archs)


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
    if isinstance(config, ElectraConfig):   # its __post_init__ refuses what HF lacks
        d = {"architectures": [architecture], "model_type": "electra"}
        d.update({k: getattr(config, k) for k in ELECTRA_HF_CONFIG_FIELDS})
        return _with_labels(d, config, id2label)
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
                return widen_half(load_torch_state_dict(directory / BIN_NAME))
            except (TorchBinError, OSError) as e:
                raise HFFormatError(f"{directory / BIN_NAME}: cannot be read ({e})") from e
        if any((directory / (n + ".index.json")).is_file() for n in (SAFETENSORS_NAME, BIN_NAME)):
            raise HFFormatError(f"{directory}: sharded checkpoints are not supported "
                                "(BERT-sized models fit in one file)")
        raise HFFormatError(f"{directory}: no {SAFETENSORS_NAME} or {BIN_NAME}")
    check_weight_bytes(safetensors_bytes(safetensors_header(st)), config, st)
    try:
        return widen_half(read_safetensors(st))
    except OSError as e:
        raise HFFormatError(f"{st}: cannot be read ({e})") from e


# safetensors dtype -> the NumPy dtype its bytes are read as (little-endian, as the format
# says); BF16 is read as 16-bit words and widened (:func:`bfloat16_to_float32`)
SAFETENSORS_NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
                     "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "U16": "<u2",
                     "U32": "<u4", "U64": "<u8", "BOOL": "?"}
EXPORT_DTYPES = ("float32", "float16", "bfloat16")


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 values, given as their 16-bit patterns (``uint16``, any shape), to
    float32 exactly: a bfloat16 is the top 16 bits of a float32 (sign, 8 exponent bits, 7
    mantissa bits), so the float32 is those bits followed by 16 zero bits.

    Returns:
        float32 array of the same shape.
    """
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def float32_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """Narrow float32 values to bfloat16 bit patterns (``uint16``, same shape), rounding to
    nearest with ties to even as ``torch.Tensor.to(torch.bfloat16)`` does (add 0x7FFF plus
    the lowest kept bit, then drop the low 16 bits); NaN stays a quiet NaN of its sign.

    Returns:
        uint16 array of the same shape (the bytes safetensors' ``BF16`` holds).
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    return np.where(nan, ((u >> 16) | np.uint32(0x0040)).astype(np.uint16), rounded)


def widen_half(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``state`` with its float16 arrays widened to float32 (exact: every float16 is a
    float32), so that weights read from a half-precision file are float32 or float64 like
    every other state minibert builds a model from; other arrays as they are."""
    return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in state.items()}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a ``.safetensors`` file as NumPy arrays, in every dtype the format
    has but the 8-bit floats; bfloat16 (``BF16``, which NumPy and safetensors' NumPy API
    do not have) widened exactly to float32 (:func:`bfloat16_to_float32`).

    The header is read and checked by :func:`minibert.untrusted.safetensors_header` (the
    format: github.com/huggingface/safetensors, "Format": an 8-byte little-endian header
    length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the data, all
    little-endian) before any tensor is read.

    Returns:
        {name: array} in file order; each array owns its memory, shape as stored.
    Raises:
        UntrustedFileError: a header that fails a check, or an F8 tensor (not supported).
        OSError: the file cannot be read.
    """
    path = Path(path)
    header = safetensors_header(path)
    for name, (dtype, _) in header.items():
        if dtype not in SAFETENSORS_NUMPY:
            raise UntrustedFileError(f"{path}: tensor {name!r} has dtype {dtype}, which "
                                     "minibert does not read (expected one of "
                                     f"{', '.join(SAFETENSORS_NUMPY)})")
    out = {}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        spans = json.loads(f.read(n).decode("utf-8"))
        for name, (dtype, shape) in header.items():     # one tensor's bytes at a time
            begin, end = spans[name]["data_offsets"]
            f.seek(8 + n + begin)
            raw = np.frombuffer(f.read(end - begin), dtype=SAFETENSORS_NUMPY[dtype])
            # one new array each (native order, writable, owning its memory): the widened
            # bfloat16, or astype's copy of the read-only buffer
            out[name] = (bfloat16_to_float32(raw) if dtype == "BF16"
                         else raw.astype(raw.dtype.newbyteorder("="))).reshape(shape)
    return out


def write_safetensors(tensors: dict[str, np.ndarray], dtype: str = "float32",
                      metadata: dict[str, str] | None = None) -> bytes:
    """The bytes of a ``.safetensors`` file holding ``tensors`` (the format as in
    :func:`read_safetensors`), floating-point tensors stored as ``dtype`` ("float32",
    "float16" or "bfloat16", rounded to nearest even), others as they are.

    Raises:
        ValueError: an unknown ``dtype``.
    """
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"export dtype {dtype!r}: expected one of {', '.join(EXPORT_DTYPES)}")
    names = {np.dtype(v): k for k, v in SAFETENSORS_NUMPY.items() if k not in ("BF16",)}
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    chunks, offset = [], 0
    for name, a in tensors.items():
        a = np.asarray(a)
        if np.issubdtype(a.dtype, np.floating):
            if dtype == "bfloat16":
                code, raw = "BF16", float32_to_bfloat16(a).astype("<u2")
            else:
                raw = a.astype("<f4" if dtype == "float32" else "<f2")
                code = "F32" if dtype == "float32" else "F16"
        else:
            raw = a.astype(a.dtype.newbyteorder("<"))
            code = names[np.dtype(raw.dtype)]
        b = np.ascontiguousarray(raw).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)        # the data starts 8-byte aligned, as the library's
    return len(head).to_bytes(8, "little") + head + b"".join(chunks)


TOKENIZER_JSON_NAME = "tokenizer.json"
# what each tokenizers model type is, for the refusal of a tokenizer.json minibert cannot read
_TOKENIZER_MODELS = {
    "BPE": "a BPE model (RoBERTa/GPT-2 byte-level BPE, or another BPE vocabulary)",
    "Unigram": "a Unigram model (SentencePiece, as ALBERT, T5 or XLNet use)",
    "WordLevel": "a WordLevel model (whole words, no sub-word pieces)"}
_SPECIAL_TOKENS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_SPECIAL_DEFAULTS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                     "cls_token": "[CLS]", "mask_token": "[MASK]"}


# transformers' model_max_length above this means "no limit" (its LARGE_INTEGER; the
# sentinel it writes is VERY_LARGE_INTEGER = int(1e30), tokenization_utils_base.py)
UNSET_MAX_LENGTH_ABOVE = int(1e20)


def max_length_field(value: Any, path: Path, name: str) -> int | None:
    """The sequence length a tokenizer file gives under ``name``
    (``tokenizer_config.json``'s ``model_max_length``, ``tokenizer.json``'s
    ``truncation.max_length``): a positive integer (an integral float is taken), or None
    for null or anything above :data:`UNSET_MAX_LENGTH_ABOVE` (transformers' "unset"
    sentinel ``1e30``).

    Raises:
        UntrustedFileError: another type, a fraction, or a value below 1, naming the field.
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and (
            value > UNSET_MAX_LENGTH_ABOVE or float(value).is_integer()):
        return None if value > UNSET_MAX_LENGTH_ABOVE else int(value)
    raise UntrustedFileError(f"{path}: field {name!r} is {value!r:.40}, expected a positive "
                             "integer (or null / 1e30 for no limit)")


def read_tokenizer_json(path: str | os.PathLike, vocab_size: int,
                        source: str = "config.json") -> tuple[list[str], dict[str, Any]]:
    """The WordPiece vocabulary and :class:`~minibert.tokenization.BertTokenizer` options of
    a ``tokenizer.json`` (the Hugging Face ``tokenizers`` library's serialisation, as
    ``BertTokenizerFast.save_pretrained`` writes it).

    Read: ``model`` (type ``WordPiece``, ``vocab`` {token: id} with ids 0..n-1,
    ``unk_token``, ``continuing_subword_prefix`` "##", ``max_input_chars_per_word``),
    ``normalizer`` (``BertNormalizer``: ``lowercase`` -> do_lower_case, ``strip_accents``,
    ``handle_chinese_chars`` -> tokenize_chinese_chars, ``clean_text`` true), the
    ``pre_tokenizer`` (``BertPreTokenizer``), [CLS] / [SEP] from the ``post_processor``,
    [PAD] from ``padding``; ``added_tokens`` (which transformers never splits) must be
    those special tokens, in the vocabulary; ``truncation.max_length`` -> model_max_length
    (the ``tokenizers`` library truncates there; transformers' ``__call__`` does not,
    going by ``tokenizer_config.json`` alone, which :func:`read_tokenizer_options` lets win).

    Args:
        path: the file (read when at most ``vocab_size`` x 2 x VOCAB_LINE_BYTES + 1 MiB).
        vocab_size: the model's embedding rows; the vocabulary may not be longer.
        source: where vocab_size comes from, for messages.
    Returns:
        (tokens in id order, options: do_lower_case, strip_accents,
        tokenize_chinese_chars, max_input_chars_per_word, model_max_length when set, and
        the special tokens that differ from BERT's defaults).
    Raises:
        HFFormatError: not a WordPiece BERT tokenizer (BPE, Unigram, WordLevel, another
            normaliser or pre-tokeniser, added tokens other than the special tokens),
            naming what it is.
        UntrustedFileError: not a JSON object, too large, a malformed vocabulary (ids not
            0..n-1, a token with a line break), more tokens than ``vocab_size``, a special
            token missing from the vocabulary.
    """
    from .tokenization.vocab import VOCAB_LINE_BYTES
    path = Path(path)
    d = read_json_object(path, limit=vocab_size * 2 * VOCAB_LINE_BYTES + (1 << 20))
    model, norm = _wordpiece_bert_parts(path, d)
    tokens = _tokenizer_json_vocab(path, model, vocab_size, source)
    opts: dict[str, Any] = {"do_lower_case": norm["lowercase"],
                            "strip_accents": norm["strip_accents"],
                            "tokenize_chinese_chars": norm["handle_chinese_chars"]}
    mic = model.get("max_input_chars_per_word", 100)
    if isinstance(mic, int) and not isinstance(mic, bool) and mic > 0 and mic != 100:
        opts["max_input_chars_per_word"] = mic
    opts.update(_tokenizer_json_specials(path, d, model, set(tokens)))
    trunc = d.get("truncation")
    if trunc is not None and not isinstance(trunc, dict):
        raise UntrustedFileError(f"{path}: \"truncation\" is {trunc!r:.40}, expected an "
                                 "object or null")
    length = max_length_field((trunc or {}).get("max_length"), path, "truncation.max_length")
    if length is not None:
        opts["model_max_length"] = length
    return tokens, opts


def _wordpiece_bert_parts(path: Path, d: dict) -> tuple[dict, dict]:
    """(``model``, ``normalizer``) of the parsed tokenizer.json ``d``, once they are a
    WordPiece model, a BertNormalizer with boolean options and a BertPreTokenizer (see
    :func:`read_tokenizer_json`).

    Raises:
        HFFormatError: any other model, normaliser or pre-tokeniser, naming it.
        UntrustedFileError: no model object, a normaliser option of another type.
    """
    model = d.get("model")
    if not isinstance(model, dict):
        raise UntrustedFileError(f"{path}: no \"model\" object, not a tokenizers file")
    kind = model.get("type")
    if kind != "WordPiece":
        what = _TOKENIZER_MODELS.get(kind, f"a model of type {kind!r:.40}")
        pre = d.get("pre_tokenizer")
        if kind == "BPE" and isinstance(pre, dict) and pre.get("type") == "ByteLevel":
            what = "a BPE model (RoBERTa/GPT-2 byte-level BPE)"
        raise HFFormatError(f"{path}: tokenizer.json holds {what}; minibert reads WordPiece "
                            "BERT tokenizers only")
    norm, pre = d.get("normalizer"), d.get("pre_tokenizer")
    if not (isinstance(norm, dict) and norm.get("type") == "BertNormalizer"):
        raise HFFormatError(f"{path}: tokenizer.json's normalizer is "
                            f"{(norm or {}).get('type') if isinstance(norm, dict) else norm!r:.60}"
                            ", not BertNormalizer; minibert reads WordPiece BERT tokenizers only")
    if not (isinstance(pre, dict) and pre.get("type") == "BertPreTokenizer"):
        raise HFFormatError(f"{path}: tokenizer.json's pre_tokenizer is "
                            f"{(pre or {}).get('type') if isinstance(pre, dict) else pre!r:.60}"
                            ", not BertPreTokenizer; minibert reads WordPiece BERT tokenizers "
                            "only")
    if model.get("continuing_subword_prefix", "##") != "##" or norm.get("clean_text") is False:
        raise HFFormatError(f"{path}: a WordPiece tokenizer with continuing_subword_prefix "
                            f"{model.get('continuing_subword_prefix')!r:.20} and clean_text "
                            f"{norm.get('clean_text')!r}; minibert's BERT tokenizer has '##' "
                            "and always cleans text (google-research/bert)")
    for k in ("lowercase", "handle_chinese_chars", "strip_accents"):
        if not (isinstance(norm.get(k), bool) or (k == "strip_accents" and norm.get(k) is None)):
            raise UntrustedFileError(f"{path}: normalizer field {k!r} is {norm.get(k)!r:.40}, "
                                     "expected true or false" + (" or null" if k ==
                                                                 "strip_accents" else ""))
    return model, norm


def _tokenizer_json_vocab(path: Path, model: dict, vocab_size: int, source: str) -> list[str]:
    """The tokens of ``model.vocab`` ({token: id}) in id order.

    Raises:
        UntrustedFileError: not an object of token -> int, more tokens than
            ``vocab_size`` (from ``source``), ids not 0..n-1 once each, a token a vocab.txt
            line cannot hold.
    """
    vocab = model.get("vocab")
    if not (isinstance(vocab, dict) and vocab and all(
            isinstance(i, int) and not isinstance(i, bool) for i in vocab.values())):
        raise UntrustedFileError(f"{path}: model.vocab is not an object of token -> id")
    if len(vocab) > vocab_size:
        raise UntrustedFileError(f"{path}: {len(vocab)} tokens, more than the vocab_size "
                                 f"{vocab_size} of {source} (the model has no embedding row "
                                 "for the rest)")
    tokens: list[str | None] = [None] * len(vocab)
    for tok, i in vocab.items():
        if not 0 <= i < len(vocab) or tokens[i] is not None:
            raise UntrustedFileError(f"{path}: model.vocab gives {tok!r:.40} the id {i}; "
                                     f"expected each id 0..{len(vocab) - 1} once")
        if "\n" in tok or "\r" in tok or not tok:
            raise UntrustedFileError(f"{path}: model.vocab holds the token {tok!r:.40}, which "
                                     "a vocab.txt line cannot hold")
        tokens[i] = tok
    return tokens


def _tokenizer_json_specials(path: Path, d: dict, model: dict, present: set[str]
                             ) -> dict[str, str]:
    """The special tokens of a tokenizer.json that differ from BERT's defaults: [UNK] from
    the model, [CLS] / [SEP] from the post-processor (BertProcessing or
    TemplateProcessing), [PAD] from ``padding``; ``added_tokens`` must be among them.

    Raises:
        UntrustedFileError: a special token missing from the vocabulary ``present``.
        HFFormatError: an added token that is not a special token of the vocabulary.
    """
    special = {"unk_token": model.get("unk_token")}
    post = d.get("post_processor")
    if isinstance(post, dict) and post.get("type") == "BertProcessing":
        special.update(cls_token=(post.get("cls") or [None])[0],
                       sep_token=(post.get("sep") or [None])[0])
    elif isinstance(post, dict) and post.get("type") == "TemplateProcessing":
        single = [p.get("SpecialToken", {}).get("id") for p in post.get("single") or []
                  if isinstance(p, dict) and "SpecialToken" in p]
        if len(single) == 2:
            special.update(cls_token=single[0], sep_token=single[1])
    pad = d.get("padding")
    if isinstance(pad, dict):
        special["pad_token"] = pad.get("pad_token")
    out: dict[str, str] = {}
    for k, tok in special.items():
        if tok is None:
            continue
        if not isinstance(tok, str) or tok not in present:
            raise UntrustedFileError(f"{path}: the {k} {tok!r:.40} is not in model.vocab")
        if tok != _SPECIAL_DEFAULTS[k]:
            out[k] = tok
    kept_whole = {out.get(k, _SPECIAL_DEFAULTS[k]) for k in _SPECIAL_TOKENS}
    for added in d.get("added_tokens") or []:
        content = added.get("content") if isinstance(added, dict) else None
        if content not in present or content not in kept_whole:
            raise HFFormatError(f"{path}: the added token {content!r:.40} is not one of the "
                                "special tokens (" + " ".join(sorted(kept_whole)) + ") in the "
                                "WordPiece vocabulary; minibert keeps only those whole, as "
                                "BERT's tokenizer does")
    return out


def vocab_of_directory(directory: Path, vocab_size: int,
                       source: str = "config.json") -> tuple[Path, dict[str, Any]]:
    """Where the WordPiece vocabulary of a Hugging Face directory is: its ``vocab.txt``,
    else the vocabulary of its ``tokenizer.json`` (:func:`read_tokenizer_json`) written
    once as a ``vocab.txt`` under the temporary directory
    (``minibert-vocab/<sha256 of tokenizer.json>/vocab.txt``, atomically), so everything
    that takes a vocab file takes it and a run started from it copies a vocab.txt.

    Returns:
        (the vocab file, tokenizer options from tokenizer.json: {} for a vocab.txt).
    Raises:
        HFFormatError: neither file, or a tokenizer.json that is not WordPiece BERT.
        UntrustedFileError, VocabError: a file that fails a check.
    """
    import hashlib
    import tempfile
    from .tokenization.vocab import check_vocab_fits, write_vocab
    vocab = directory / VOCAB_NAME
    if vocab.is_file():
        check_vocab_fits(vocab, vocab_size, source)
        return vocab, {}
    tj = directory / TOKENIZER_JSON_NAME
    if not tj.is_file():
        spm = next((n for n in ("spiece.model", "sentencepiece.bpe.model")
                    if (directory / n).is_file()), None)
        raise HFFormatError(f"{directory}: no {VOCAB_NAME} or {TOKENIZER_JSON_NAME} (a "
                            "WordPiece vocabulary is needed)" + (
                                f"; its {spm} is a SentencePiece model (as ALBERT's, T5's, "
                                "XLNet's), which minibert does not read" if spm else ""))
    tokens, opts = read_tokenizer_json(tj, vocab_size, source)
    digest = hashlib.sha256(tj.read_bytes()).hexdigest()[:32]
    out = Path(tempfile.gettempdir()) / "minibert-vocab" / digest / VOCAB_NAME
    if not out.is_file() or out.read_bytes() != "".join(t + "\n" for t in tokens).encode():
        write_vocab(tokens, out)
    check_vocab_fits(out, vocab_size, source)
    return out, opts


def read_tokenizer_options(directory: Path,
                           defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """BertTokenizer options from ``tokenizer_config.json`` when present, over ``defaults``
    (e.g. what ``tokenizer.json`` says; default: lower-case): ``do_lower_case``,
    ``tokenize_chinese_chars`` and ``clean_up_tokenization_spaces`` booleans,
    ``strip_accents`` a boolean or null, ``model_max_length`` (:func:`max_length_field`;
    its "unset" leaves ``defaults``' length, i.e. tokenizer.json's, standing).

    Raises:
        UntrustedFileError: the file is not a JSON object, or an option of another type.
    """
    opts: dict[str, Any] = {"do_lower_case": True, **(defaults or {})}
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
        length = max_length_field(t.get("model_max_length"), tc, "model_max_length")
        if length is not None:
            opts["model_max_length"] = length
    return opts


def load_hf_directory(directory: str | os.PathLike) -> HFCheckpoint:
    """Read a Hugging Face BERT directory (see the module docstring), checking each file
    before memory is spent on it (:mod:`minibert.untrusted`): config.json's fields and
    the size of the model they imply, vocab.txt's (or tokenizer.json's) length against
    ``vocab_size`` (:func:`vocab_of_directory`),
    tokenizer_config.json's options, the weights file's header and declared bytes; then
    that the weights have the config's shapes and are finite.

    Returns:
        :class:`HFCheckpoint`; load ``state`` into a model with
        :func:`load_pretrained_weights`.
    Raises:
        HFFormatError: missing config.json / vocab / weights, an unsupported option, a
            tokenizer.json that is not WordPiece BERT.
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
    vocab, json_opts = vocab_of_directory(directory, config.vocab_size, str(cfg_path))
    tok_opts = read_tokenizer_options(directory, json_opts)
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
# (ELECTRA's encoder is BERT's: its prefix tells them apart)
FAMILY_MARKERS = {BertConfig: ".encoder.layer.", AlbertConfig: ".albert_layer_groups.",
                  DistilBertConfig: ".transformer.layer.", ElectraConfig: ".encoder.layer."}


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
                      tokenizer_options: dict[str, Any] | None = None,
                      dtype: str = "float32") -> Path:
    """Write ``model`` as a Hugging Face directory that transformers loads.

    Files (each written atomically): ``config.json`` (``architectures`` = the model's
    class name, HF field names, ``id2label``/``label2id``), ``model.safetensors`` (``dtype``;
    tied weights stored once, under their first name, as transformers does), ``vocab.txt`` (a copy) and ``tokenizer_config.json``.

    Args:
        model: BertModel, BertForPreTraining, BertForSequenceClassification,
            BertForTokenClassification or BertForQuestionAnswering, or the Albert* class
            of each, or an Electra* class of :mod:`minibert.electra` (ElectraModel,
            ElectraForPreTraining, ElectraForMaskedLM and the heads).
        directory: created if needed.
        vocab_file: the WordPiece vocabulary the model was trained with.
        id2label: class names for classification models (tags for token classification).
        tokenizer_options: ``do_lower_case`` etc. (default: lower-case).
        dtype: the weights' type in the file: "float32" (the default, whatever the model
            computes in), "float16" or "bfloat16" (rounded to nearest even; config.json
            then says ``torch_dtype``/``dtype`` as transformers writes it).
    Returns:
        the directory.
    Raises:
        HFFormatError: a config HF BERT (ALBERT) cannot express (see
            :func:`config_to_hf`), or an unknown ``dtype``.
    """
    from .backend import to_numpy

    if dtype not in EXPORT_DTYPES:
        raise HFFormatError(f"export dtype {dtype!r}: expected one of {', '.join(EXPORT_DTYPES)}")

    directory = Path(directory)
    arch = type(model).__name__
    cfg = config_to_hf(model.config, arch, id2label)
    tensors = {name: np.ascontiguousarray(to_numpy(p.data))
               for name, p in model.named_parameters()}
    directory.mkdir(parents=True, exist_ok=True)
    if dtype != "float32":
        cfg["torch_dtype"] = cfg["dtype"] = dtype    # transformers 4 reads the first, 5 the second
    blob = write_safetensors(tensors, dtype, metadata={"format": "pt"})
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
