"""The package under test: `TINY_LLM_SOLUTION=learner` (the default of `pdm run
test`) picks src/tiny_llm, `ref` (`pdm run test-refsol`) picks src/tiny_llm_ref.
Unset, as under plain `pytest`, it is the reference when the tree has it and the
learner's package when it does not (a learner who does not peek has no
src/tiny_llm_ref)."""

import importlib
import importlib.util
import os

from .weights_once import install

install()  # before the package under test imports dequantize_linear

PACKAGES = {"learner": "tiny_llm", "ref": "tiny_llm_ref"}
HAS_REFERENCE = importlib.util.find_spec(PACKAGES["ref"]) is not None
SOLUTION = os.environ.get("TINY_LLM_SOLUTION", "ref" if HAS_REFERENCE else "learner")
tiny = importlib.import_module(PACKAGES[SOLUTION])
