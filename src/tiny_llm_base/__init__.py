"""tiny-llm's infrastructure: what both the reference and the learner's package use
but neither teaches. The fast BLAS, model loading and the embedded model, the objects
a request and a scheduler report in, the weight helpers around mlx-lm's layers, and
JSON Schema constraints through llguidance (structured.py), and the sampling options a
request may ask for beyond its sampler (sampling_options.py)."""

from . import fast_blas  # noqa: F401  (first: OpenBLAS must load before mlx.core)
from .config import EngineConfig
from .device import gpu_paths
from .config_checks import KV_CACHES, POLICIES
from .embedded_model import EmbeddedModelError
from .loader import ModelLoadError, load_model
from .prompts import (
    PRIORITIES,
    GenerationResult,
    PromptSpec,
    Sampler,
    check_int,
    greedy,
    is_int,
    prompt_token_ids,
    request_prompt_ids,
    sampled_token_id,
)
from .sampling_options import (
    MAX_LOGPROBS,
    PlainSampling,
    SamplingOptions,
    TokenLogprob,
    for_choice,
    start_sampling,
)
from .structured import (
    Grammar,
    GrammarState,
    JsonObject,
    JsonSchema,
    NoConstraint,
    UnsatisfiableConstraint,
)
from .reports import BatchResults, ForwardRecord, SchedulerSnapshot, SlotView
from .weights import (
    DEFAULT_MAX_SEQ_LEN,
    QuantizedWeights,
    check_supported_architecture,
    choose_weight_format,
    dequantize_linear,
)
