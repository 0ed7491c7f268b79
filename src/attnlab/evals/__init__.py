"""Evaluations of Hugging Face models and their attnlab variants at long contexts:
sliding-window perplexity (:mod:`.perplexity`), passkey retrieval (:mod:`.passkey`), the
compared variants (:mod:`.variants`, :mod:`.models`) and the side-by-side runner behind
``attnlab long-context`` (:mod:`.long_context`). The quality-vs-speed frontier drawn from
its results is :mod:`attnlab.report.frontier`."""
