"""Corpora, tokenizers, cached token streams and batches for language-model training.

``load_corpus(DataConfig(...))`` returns a ``TokenizedCorpus`` of three memory-mapped token
streams; ``random_batch`` and ``SequentialBatches`` cut them into training and evaluation
batches.
"""

from .batches import SequentialBatches, random_batch, rank_shard
from .config import CORPORA, TOKENIZERS, DataConfig
from .load import TokenizedCorpus, load_corpus, open_source
from .tokenizers import BPETokenizer, ByteTokenizer, Tokenizer, load_tokenizer, train_bpe

__all__ = [
    "CORPORA",
    "TOKENIZERS",
    "BPETokenizer",
    "ByteTokenizer",
    "DataConfig",
    "SequentialBatches",
    "TokenizedCorpus",
    "Tokenizer",
    "load_corpus",
    "load_tokenizer",
    "open_source",
    "random_batch",
    "rank_shard",
    "train_bpe",
]
