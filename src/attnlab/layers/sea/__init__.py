"""The ``sea`` core: sparse attention on a mask estimated by a Performer + CNN (Lee et al.,
ICLR 2024).

Per query row: a Performer over ``[position code, v]`` and a small encoder/CNN estimate the
row's attention compressed into ``K = predictor_length`` bins that are stretched over the
row's own visible keys; the top cells within a budget (grouped across heads by default) are
decompressed into per-row lists of key runs (at most ``k`` keys per bin) and exact softmax
attention runs on those keys only (:func:`attnlab.ops.sparse_attention.cell_attention`,
O(T * H * k) work and memory).
The probabilities are scaled by ``sigmoid(s0)`` and the result is mixed with an average
context by ``sigmoid(s1)``. Every step costs O(T) in the sequence length.

The estimator does not get a gradient through the top-k selection. In training mode the core
therefore adds ``estimator_loss`` x loss (a) of the SEA recipe, with the layer's own dense
attention (detached, O(T^2) memory in training only) as the target; distillation from a
teacher replaces that target (see ``attnlab distill``).

Causal decoding carries a state whose size does not grow with the keys, so a step's estimator
reads only the new keys and its attention only the selected ones (see :mod:`.decoding`).

Files: ``options`` (:class:`SEAOptions`), ``cnn`` (the decoders), ``estimator`` (Performer +
encoder + CNN), ``decoding`` (key ranks, the decoding state), ``core`` (:class:`SEACore`) and
``estimates`` (reading a model's estimated attention: :func:`record_estimates`).
"""

from attnlab.layers.sea.cnn import BidirectionalCNN, CausalCNN
from attnlab.layers.sea.core import SEACore
from attnlab.layers.sea.decoding import SEAState
from attnlab.layers.sea.estimates import SEAEstimate, record_estimates
from attnlab.layers.sea.estimator import EstimatorState, SEAEstimator
from attnlab.layers.sea.options import SEAOptions

__all__ = [
    "BidirectionalCNN",
    "CausalCNN",
    "EstimatorState",
    "SEACore",
    "SEAEstimate",
    "SEAEstimator",
    "SEAOptions",
    "SEAState",
    "record_estimates",
]
