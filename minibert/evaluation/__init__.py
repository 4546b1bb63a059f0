"""What a start is worth without pretraining it further: the evaluation harness of
``evaluate.py`` (:mod:`.harness`: label budgets, seeds, each start at its own best
learning rate, floors) and the linear probes it fits on frozen features and bags of words
(:mod:`.probe`)."""
