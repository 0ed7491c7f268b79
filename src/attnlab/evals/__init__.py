"""Evaluations of Hugging Face models and their attnlab variants at long contexts:
sliding-window perplexity (:mod:`.perplexity`), passkey retrieval (:mod:`.passkey`), the
side-by-side runner behind ``attnlab long-context`` (:mod:`.long_context`) and the
quality-vs-speed frontier (:mod:`.frontier`)."""
