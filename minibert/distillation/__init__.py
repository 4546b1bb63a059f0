"""Knowledge distillation: a student learns from a teacher's outputs.

General distillation (``train_mlm.py --teacher``, docs/distillation.md): a student BERT
learns masked-LM from a frozen teacher BERT.

* :mod:`.losses`: the losses, each a forward / backward pair: soft targets on the MLM
  distributions (Hinton et al. 2015; DistilBERT), cosine on the last hidden states and on
  their mean-pooled sentence embeddings, MiniLM's attention transfer, and the soft-label
  loss of task distillation;
* :mod:`.teacher`: the frozen teacher (:class:`Teacher`, :func:`load_teacher`);
* :mod:`.students`: starting weights taken from the teacher (every other layer, the
  projected embeddings), and :mod:`.pruning`: the teacher pruned to the student's sizes
  on calibration batches (Minitron);
* :mod:`.model`: the student, :class:`DistillationModel`, and its loss weights;
* :mod:`.job`: the start of a run from its options: the options themselves, the teacher,
  the student's config and its starting weights.

Task distillation (``finetune.py --teacher``): a sequence classifier learns from a
fine-tuned teacher's soft labels (:mod:`.task`, with its options).
"""
from .job import (ARCHITECTURE_OPTIONS, OPTIONS, STUDENT_INITS, DistillationOptions,
                  ResolvedTeacher, add_arguments, describe_teacher, init_student,
                  resolve_teacher, student_config)
from .losses import (COSINE_EPS, attention_kl_backward, attention_kl_forward,
                     cosine_loss_backward, cosine_loss_forward, pooled_cosine_loss_backward,
                     pooled_cosine_loss_forward, soft_label_loss_backward,
                     soft_label_loss_forward, soft_target_kl_backward, soft_target_kl_forward)
from .model import (AlbertDistillationModel, DistillationModel, DistillationOutput,
                    DistillationWeights, student_class)
from .pruning import (PRUNED_SIZES, ActivationImportance, activation_importance,
                      layer_activations, pruned_config, pruned_state, top_indices)
from .students import (LAYER_KEY, every_other_layer_config, every_other_layer_state,
                       projected_embeddings_state)
from .task import (TASK_OPTIONS, SoftTargets, add_task_arguments, read_transfer, soft_targets,
                   teacher_logits, with_transfer_rows)
from .teacher import Teacher, TeacherOutput, has_mlm_head, load_teacher

__all__ = [
    # losses
    "COSINE_EPS", "attention_kl_backward", "attention_kl_forward", "cosine_loss_backward",
    "cosine_loss_forward", "pooled_cosine_loss_backward", "pooled_cosine_loss_forward",
    "soft_label_loss_backward", "soft_label_loss_forward", "soft_target_kl_backward",
    "soft_target_kl_forward",
    # teacher, students, pruning, the student model
    "Teacher", "TeacherOutput", "has_mlm_head", "load_teacher",
    "LAYER_KEY", "every_other_layer_config", "every_other_layer_state",
    "projected_embeddings_state",
    "PRUNED_SIZES", "ActivationImportance", "activation_importance", "layer_activations",
    "pruned_config", "pruned_state", "top_indices",
    "AlbertDistillationModel", "DistillationModel", "DistillationOutput",
    "DistillationWeights", "student_class",
    # the start of a run
    "ARCHITECTURE_OPTIONS", "OPTIONS", "STUDENT_INITS", "DistillationOptions",
    "ResolvedTeacher", "add_arguments", "describe_teacher", "init_student", "resolve_teacher",
    "student_config",
    # task distillation
    "TASK_OPTIONS", "SoftTargets", "add_task_arguments", "read_transfer", "soft_targets",
    "teacher_logits", "with_transfer_rows",
]
