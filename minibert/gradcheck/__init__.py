"""Numerical gradient checking (central differences, float64), shared by tests and users.

Three levels of API:

* :func:`rel_error`, :func:`numerical_gradient`, :func:`directional_derivative`,
  :func:`difference_noise` and :func:`check_tensor`: the primitives (arrays perturbed in
  place and restored exactly);
* :func:`check_module`: every parameter and input gradient of a :class:`~minibert.nn.Module`
  (yours or ours) against central differences, returned as a :class:`GradcheckReport`
  that prints as a table;
* the command line, ``python -m minibert.gradcheck --layer all``, which checks every
  layer of minibert on small shapes (:func:`run_checks`) and exits 1 if any tensor fails.
  ``--perturb NAME`` corrupts one term of one backward pass (see :data:`PERTURBATIONS`)
  for the duration of the check, to show what a wrong gradient looks like.

Modules: ``core`` (the primitives, :func:`check_module` and the report), ``perturbations``
(the wrong backwards), ``catalogue`` (the layer checks and :func:`random_token_batch`),
``__main__`` (the command line).
"""
from .catalogue import LAYERS, Shapes, layer_checks, random_token_batch, run_checks
from .core import (GradcheckReport, GradcheckRow, check_module, check_tensor,
                   difference_noise, directional_derivative, numerical_gradient, rel_error)
from .perturbations import PERTURBATIONS, perturbed

__all__ = [
    "LAYERS", "PERTURBATIONS", "GradcheckReport", "GradcheckRow", "Shapes", "check_module",
    "check_tensor", "difference_noise", "directional_derivative", "layer_checks",
    "numerical_gradient", "perturbed", "random_token_batch", "rel_error", "run_checks",
]
