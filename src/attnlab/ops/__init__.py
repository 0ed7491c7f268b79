"""Stateless functional ops. Attention ops take ``[batch, heads, seq, head_dim]`` tensors.

Every op folder has a naive reference that the fast paths are tested against: each fast op
registers its contract with its reference next to its code (:mod:`attnlab.ops.contract`).
"""
