"""attnlab.hf needs the ``hf`` extra (transformers); without it these tests are not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("transformers") else ["test_*.py"]
