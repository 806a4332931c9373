"""`SidecarEvaluator`: evaluates each checkpoint as training writes it.

The ``"evaluator"`` task of a cluster (`kerastower.cluster.is_evaluator`,
``kerastower launch --evaluator``) trains nothing: it watches the files a
`kerastower.callbacks.ChiefCheckpoint` writes, loads each new one into its
own model and evaluates it on its own devices, so that the training workers
never stop for a validation pass. It reads only whole files (the chief
writes each checkpoint under a hidden temporary name and renames it into
place) and joins no collective, so it never blocks the workers.
"""

# The code is in kerastower/workers/evaluator.py; this module hands on its
# public names under the path they have always had.
from kerastower.workers.evaluator import LOG_NAME, SidecarEvaluator

__all__ = ["LOG_NAME", "SidecarEvaluator"]
