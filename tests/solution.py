"""The package under test: `TINY_LLM_SOLUTION=learner` (the default of `pdm run
test`) picks src/tiny_llm, `ref` (the default here, and `pdm run test-refsol`) picks
src/tiny_llm_ref."""

import importlib
import os

PACKAGES = {"learner": "tiny_llm", "ref": "tiny_llm_ref"}
SOLUTION = os.environ.get("TINY_LLM_SOLUTION", "ref")
tiny = importlib.import_module(PACKAGES[SOLUTION])
