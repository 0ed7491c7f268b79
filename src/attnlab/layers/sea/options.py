"""Options of the ``sea`` core and the sizes its fast paths are tuned with."""

from __future__ import annotations

import dataclasses

from attnlab.layers.cores import ScoreOptions
from attnlab.layers.performer import PerformerOptions
from attnlab.ops.sea import GROUPS

OUTPUTS = ("auto", "mix", "norm", "norm_head")
PATHS = ("auto", "sparse", "dense")
# Keys up to which the "auto" path attends through a dense masked matrix: measured on the
# 2-core dev box, training configs/tiny/cores/sea.yaml (T = 256, 8 heads, batch 8) ran at
# 1,957 tok/s this way against 1,015 with the cell gathers, whose many small ops (and
# checkpointed recomputation) dominate at short T.
DENSE_PATH_MAX_KEYS = 512

@dataclasses.dataclass(frozen=True)
class SEAOptions:
    """Options of the ``sea`` core.

    * ``k``: keys per head the budget is sized for (a row gets about ``H * k`` keys). May be
      changed at inference without retraining (dynamic k: :meth:`SEACore.set_inference`).
    * ``predictor_length``: ``K``, bins of the compressed estimate (a multiple of 4).
    * ``topk_group``: ``"heads"`` (rank a row's ``H * K`` cells jointly, SEA's causal default),
      ``"batch"`` (rank a sample's ``H * T * K`` cells jointly, budget ``H * k * K``: SEA's
      bidirectional default; bidirectional only)
      or ``"head"`` (each head's ``K`` cells with budget ``k * K / L_t``).
    * ``n_features``: Performer random features; None = ``d ln d / 8`` when causal (SEA's
      OPT setting), ``d ln d`` otherwise (BERT). ``kernel``: as the ``performer`` core
      ("auto" = ReLU when causal, FAVOR+ softmax otherwise). ``redraw_every``: Performer
      projection redraw period in training calls (0 = never).
    * ``query_skip``: run the encoder/CNN on every s-th query row only and reuse its estimate
      for the next ``s - 1`` rows (switchable at inference).
    * ``output``: ``"mix"`` (sigmoid(s1) mix only), ``"norm"`` (then ``LayerNorm(o) + o`` with
      the LayerNorm over the concatenated heads, ``H * d_head``: SEA's BERT form),
      ``"norm_head"`` (the same with one LayerNorm over ``d_head`` shared by the heads) or
      ``"auto"`` (mix when causal, norm otherwise).
    * ``gate_init``: initial bias of the two scaler logits ``s0, s1``. 0 (SEA's) starts both
      gates near 0.5, halving the attention and mixing in the average context; e.g. 4
      (sigmoid = 0.98) starts a model converted from a pretrained one at its teacher's
      attention restricted to the selected keys.
    * ``estimator_loss``: weight (averaged over layers) of the self-distillation loss on the
      estimate in training mode; 0 turns it off (e.g. when a teacher provides the target).
    * ``attention_path``: how the exact attention on the selected keys runs: ``"sparse"``
      (:func:`~attnlab.ops.sparse_attention.cell_attention`, O(T) memory), ``"dense"`` (the
      same mask scattered into a dense ``[B, H, rows, Tk]`` matrix: SEA's training-time
      simulation, O(T^2)) or ``"auto"`` (dense when ``Tk <=`` :data:`DENSE_PATH_MAX_KEYS`,
      where the dense form is faster on CPU; sparse otherwise). All give the same result.
    * ``query_chunk``: query rows per gather of the sparse attention (None = automatic).
    * ``activation``, ``sigmoid_bias``: the score activation of the exact attention on the
      selected keys, as the dense cores' (:class:`~attnlab.layers.cores.ScoreOptions`):
      ``softmax`` (SEA's), ``softmax1`` or ``sigmoid``; other than softmax, the attention
      runs on the PyTorch path, not the native kernel. The estimator learns each key's share
      of its row's total weight under it.
    """

    k: int = 64
    predictor_length: int = 64
    topk_group: str = "heads"
    n_features: int | None = None
    kernel: str = "auto"
    redraw_every: int = 1000
    query_skip: int = 1
    output: str = "auto"
    gate_init: float = 0.0
    estimator_loss: float = 1.0
    attention_path: str = "auto"
    query_chunk: int | None = None
    activation: str = "softmax"
    sigmoid_bias: float | None = None

    @property
    def scoring(self) -> ScoreOptions:
        return ScoreOptions(self.activation, self.sigmoid_bias)

    def validate(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.predictor_length < 4 or self.predictor_length % 4:
            raise ValueError(
                f"predictor_length must be a positive multiple of 4, got {self.predictor_length}"
            )
        if self.topk_group not in GROUPS:
            raise ValueError(f"topk_group must be one of {list(GROUPS)}, got {self.topk_group!r}")
        if self.query_skip < 1:
            raise ValueError(f"query_skip must be >= 1, got {self.query_skip}")
        if self.output not in OUTPUTS:
            raise ValueError(f"output must be one of {list(OUTPUTS)}, got {self.output!r}")
        if self.attention_path not in PATHS:
            raise ValueError(f"attention_path must be one of {list(PATHS)}, got "
                             f"{self.attention_path!r}")
        if self.estimator_loss < 0:
            raise ValueError(f"estimator_loss must be >= 0, got {self.estimator_loss}")
        PerformerOptions(self.kernel, self.n_features, self.redraw_every).validate()
        self.scoring.validate()
