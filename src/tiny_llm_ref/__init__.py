"""tiny-llm, the reference solution. One module per concept, in the book's order."""

from tiny_llm_base import fast_blas  # noqa: F401  (first: OpenBLAS before mlx.core)
from tiny_llm_base import (
    BatchResults,
    EngineConfig,
    GenerationResult,
    Grammar,
    GrammarState,
    JsonObject,
    JsonSchema,
    ModelLoadError,
    PromptSpec,
    QuantizedWeights,
    SamplingOptions,
    SchedulerSnapshot,
    SlotView,
    TokenLogprob,
    choose_weight_format,
    load_model,
)
from .basics import linear, silu, softmax
from .attention import (
    SimpleMultiHeadAttention,
    causal_mask,
    scaled_dot_product_attention_grouped,
    scaled_dot_product_attention_simple,
)
from .positional_encoding import RoPE
from .layer_norm import RMSNorm
from .embedding import Embedding
from .qwen2_week1 import Qwen2MLP, Qwen2ModelWeek1
from .sampler import TokenSampler, make_sampler
from .generate import simple_generate, simple_generate_with_kv_cache
from .kv_cache import BatchingKvCache, BatchRowView, TinyKvCache, TinyKvFullCache
from .quantize import (
    dequantize_weight,
    quantized_matmul,
    unpack_quantized,
)
from .qwen2_week2 import Qwen2ModelWeek2
from .qwen2_ops import FastRope, fused_rms_norm, fused_rope, packed_rows
from .cpu_kernels import cpu_attention, fast_exp
from .flash_attention import flash_attention
from .metrics import RequestMetrics, RunMetrics
from .request import DraftState, PromptChoice, Request
from .chunking import AdaptiveChunker, select_chunk_size
from .kv_manager import DenseKvManager, KvManager
from .planner import Plan, Planner
from .mixed_step import PrefillChunk, mixed_forward
from .preemption import Preemption
from .policy import AlternatePolicy, Policy
from .mixed_policy import MixedPolicy, Sharing
from .runner import Forward, ModelRunner, accept_drafts
from .block_pool import BlockPool, BlockTable, blocks_needed, chain_hash
from .layer_blocks import LayerBlocks
from .paged_cache import PagedBatchingKvCache, PagedKvCache, group_rows
from .quantized_pool import QuantizedLayerBlocks
from .paged_manager import PagedKvManager
from .prefix_cache import PrefixCachingKvManager
from .disk_tier import DiskTierKvManager, SpillingBlockPool
from .speculative import (
    DRAFT_TOKEN_COST,
    DRAFT_TOKEN_COST_ALONE,
    break_even,
    can_verify,
    find_drafts,
    is_greedy,
    may_draft,
    plan_drafts,
    record_verification,
    verified_tokens,
    worth_drafting,
)
from .automaton import DEAD, Dfa, compile_choices, compile_regex
from .regex_parser import parse_regex
from .constrained import (
    Choice,
    ConstraintState,
    Regex,
    Vocabulary,
    start_constraint,
    token_texts,
    vocabulary_of,
)
from .token_index import TokenIndex
from .choices import choices_to_stop, make_choices
from .reporting import Reports, RequestOutput
from .engine import Engine, make_kv_manager, make_policy
from .batch import batch_generate
from .sharding import HeadShard, shard_heads, shard_range, split_evenly
from .tensor_parallel import (
    ShardedAttention,
    ShardedBlock,
    ShardedQwen2Model,
    input_columns,
    output_rows,
)
from .draft_head import (
    DraftHead,
    draft_vocabulary,
    fingerprint,
    load_draft_head,
    save_draft_head,
)
from .draft_training import (
    DraftExamples,
    acceptance,
    draft_examples,
    draft_loss,
    hidden_states,
    train_head,
)
from .tool_calls import (
    ToolCall,
    call_of,
    call_schema,
    check_tools,
    parse_tool_calls,
    tool_constraint,
    tool_grammar,
)
