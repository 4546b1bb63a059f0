"""``electra``: replaced-token detection (Clark et al. 2020) on the inputs of ``mlm``.

The data are those of :class:`~minibert.objectives.mlm.FullSentencesMLM` (packed full
sentences, 15% of the tokens masked as BERT does), no sentence task; the model is
:class:`minibert.electra.ElectraForPreTraining` (a generator fills the masks, the
discriminator spots the replaced tokens). The metrics add the discriminator's ``rtd_loss``
(nats per real token), ``rtd_acc`` (its accuracy over real tokens) and ``rtd_replaced``
(the share of real tokens the generator's samples changed) to the generator's MLM ones.
"""
from __future__ import annotations

import math

from .mlm import FullSentencesMLM

__all__ = ["ReplacedTokenDetection"]


class ReplacedTokenDetection(FullSentencesMLM):
    """ELECTRA on full-sentence inputs (see the module docstring)."""

    name = "electra"
    sentence_task = None

    def build_model(self, config, *, seed: int = 0, dtype=None, label_smoothing: float = 0.0,
                    generator_layers: int | None = None, **kwargs):
        """:class:`minibert.electra.ElectraForPreTraining` (generator of
        ``generator_layers`` layers, default half the discriminator's).

        Raises:
            ValueError: label smoothing, which ELECTRA's losses do not take.
        """
        import numpy as np
        from ..electra import ElectraForPreTraining
        if label_smoothing:
            raise ValueError("--label-smoothing is not supported with --objective electra")
        return ElectraForPreTraining(config, generator_layers=generator_layers, seed=seed,
                                     dtype=dtype or np.float32, **kwargs)

    def stats(self, outputs, inputs: dict) -> dict:
        """Device sums: the MLM sums of :meth:`Objective.stats` plus ``rtd_loss_sum``,
        ``rtd_correct``, ``rtd_count`` (real tokens) and ``rtd_replaced``."""
        from ..electra import RTDStats
        return RTDStats.stats(outputs, inputs)

    def summarize(self, totals: dict) -> dict:
        """Host means: ``mlm_loss``, ``mlm_acc``, ``rtd_loss``, ``rtd_acc``,
        ``rtd_replaced`` (nan where a count is 0)."""
        out = super().summarize(totals)
        n = totals["rtd_count"]
        out["rtd_loss"] = totals["rtd_loss_sum"] / n if n else math.nan
        out["rtd_acc"] = totals["rtd_correct"] / n if n else math.nan
        out["rtd_replaced"] = totals["rtd_replaced"] / n if n else math.nan
        return out
