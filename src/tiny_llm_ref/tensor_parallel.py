"""Tensor parallelism: the week 2 model split over the ranks of an mx.distributed group.

Megatron's cut, two all_sums per layer. In attention, q_proj, k_proj and v_proj are
split by output: each rank computes only its own heads (sharding.shard_heads), so
attention itself needs no communication, and each rank's KV cache holds only its
heads. o_proj is split by input: a rank multiplies its heads' outputs by its columns
of o_proj, which gives a partial sum of the full [B, L, E] result; one all_sum adds
the ranks' parts. The MLP is cut the same way: gate_proj and up_proj by output (a
slice of the hidden units; SwiGLU works on each unit alone), down_proj by input,
then one all_sum.

The embedding, the norms and the LM head are copied to every rank: after each
all_sum every rank holds the same residual stream, and every rank computes the same
logits, so every rank can sample the same token (greedy, or one seed everywhere).

ShardedQwen2Model has Qwen2ModelWeek2's interface (model(tokens, offset, cache),
create_kv_cache(), layers, embedding, logits): the engine, the mixed step and the
paged cache run on it unchanged, one engine per rank, as long as every rank sees the
same requests and makes the same decisions.
"""

import mlx.core as mx
from mlx import nn

from tiny_llm_base import QuantizedWeights

from .qwen2_ops import Weight, project
from .qwen2_week2 import (
    Qwen2AttentionWeek2,
    Qwen2BlockWeek2,
    Qwen2ModelWeek2,
)
from .sharding import HeadShard, shard_heads, shard_range


def output_rows(w: Weight, start: int, stop: int) -> Weight:
    """Rows start .. stop - 1 of a [out, in] weight (outputs start .. stop - 1), as
    an array of its own: a slice is a view that would keep the whole matrix alive.
    A 1-D array (a bias) is cut the same way; None is not a weight: a caller with an
    optional bias keeps None itself."""
    # Week 4 Day 1 Task 2: output_rows: mx.contiguous(w[start:stop]); a QuantizedWeights
    # keeps its group_size and bits and slices weight, scales and biases by row
    if isinstance(w, mx.array):
        return mx.contiguous(w[start:stop])
    return QuantizedWeights(
        mx.contiguous(w.weight[start:stop]),
        mx.contiguous(w.scales[start:stop]),
        mx.contiguous(w.biases[start:stop]),
        w.group_size,
        w.bits,
    )


def input_columns(w: Weight, start: int, stop: int) -> Weight:
    """Columns start .. stop - 1 of a [out, in] weight (the inputs start .. stop - 1),
    as an array of its own. A quantized weight packs `bits` bits per input into
    uint32 columns and keeps a scale and bias per group_size inputs: both ends must
    fall on a group's edge, else a ValueError that says to shard a dense model
    (weights='float32'). Inputs start .. stop - 1 are then the packed columns
    start * bits // 32 .. stop * bits // 32 - 1 and the scale and bias columns
    start // group_size .. stop // group_size - 1."""
    # Week 4 Day 1 Task 2: input_columns: mx.contiguous(w[:, start:stop]); a
    # QuantizedWeights: ValueError unless group_size divides start and stop, then the
    # columns of its packed weight, scales and biases that hold inputs start .. stop - 1
    if isinstance(w, mx.array):
        return mx.contiguous(w[:, start:stop])
    if start % w.group_size or stop % w.group_size:
        raise ValueError(
            f"columns {start}..{stop} cut through a quantization group of "
            f"{w.group_size}: shard a dense model (weights='float32')"
        )
    g = w.group_size
    return QuantizedWeights(
        mx.contiguous(w.weight[:, start * w.bits // 32 : stop * w.bits // 32]),
        mx.contiguous(w.scales[:, start // g : stop // g]),
        mx.contiguous(w.biases[:, start // g : stop // g]),
        w.group_size,
        w.bits,
    )


def group_unit(w: Weight) -> int:
    """The smallest number of input columns a cut may take: 1 for a dense weight, a
    quantization group for a quantized one."""
    return 1 if isinstance(w, mx.array) else w.group_size


class ShardedAttention(Qwen2AttentionWeek2):
    """One rank's heads of a Qwen2AttentionWeek2: its rows of wq, wk, wv (and their
    biases), its columns of wo. project_qkv, apply_rope and attention are the
    parent's, on fewer heads; project_out ends with the all_sum. The class
    subclasses the parent for its methods only: __init__ does not call the
    parent's (it needs an mlx-lm layer) but sets the same attributes from `full`,
    sharing its RoPE."""

    def __init__(
        self, full: Qwen2AttentionWeek2, heads: HeadShard, group: mx.distributed.Group
    ):
        # Week 4 Day 1 Task 2: ShardedAttention: num_heads, num_kv_heads from `heads`;
        # head_dim, scale, rope, fast as in `full`; output_rows of wq (rows
        # q_start * head_dim .. q_stop * head_dim), wk and wv (the kv rows), the same
        # rows of their biases (a bias that is None stays None: check before cutting);
        # input_columns of wo over the query heads' columns; bo whole (added once,
        # after the sum); wqkv and bqkv None (one product each); keep the group
        D = full.head_dim
        q, kv = (
            (heads.q_start * D, heads.q_stop * D),
            (
                heads.kv_start * D,
                heads.kv_stop * D,
            ),
        )
        self.num_heads, self.num_kv_heads = heads.num_heads, heads.num_kv_heads
        self.head_dim, self.scale = D, full.scale
        self.rope, self.fast = full.rope, full.fast
        self.wq = output_rows(full.wq, *q)
        self.wk = output_rows(full.wk, *kv)
        self.wv = output_rows(full.wv, *kv)
        self.bq, self.bk, self.bv = (
            None if b is None else mx.contiguous(b[start:stop])
            for b, (start, stop) in ((full.bq, q), (full.bk, kv), (full.bv, kv))
        )
        self.wo = input_columns(full.wo, *q)
        self.bo = full.bo
        self.wqkv = self.bqkv = None  # the parent's project_qkv: three products
        self.group = group

    def project_out(self, out: mx.array) -> mx.array:
        """out: [B, H_local, L, D] -> [B, L, E]: this rank's heads through its columns
        of wo give a partial sum; all_sum adds every rank's part, then the bias."""
        # Week 4 Day 1 Task 2: project_out: as Qwen2AttentionWeek2's, without the bias;
        # then mx.distributed.all_sum over the group; then bo, if any
        B, _, L, _ = out.shape
        part = project(out.swapaxes(1, 2).reshape(B, L, -1), self.wo, fast=self.fast)
        total = mx.distributed.all_sum(part, group=self.group)
        return total if self.bo is None else total + self.bo


class ShardedBlock(Qwen2BlockWeek2):
    """One rank's part of a Qwen2BlockWeek2: a ShardedAttention, its slice of the
    MLP's hidden units (rows of gate and up, columns of down), both norms whole."""

    def __init__(
        self,
        full: Qwen2BlockWeek2,
        heads: HeadShard,
        hidden: tuple[int, int],
        group: mx.distributed.Group,
    ):
        # Week 4 Day 1 Task 2: ShardedBlock: attention =
        # ShardedAttention(full.attention, heads, group); output_rows of w_gate and w_up
        # and input_columns of w_down over the hidden units hidden[0] .. hidden[1] - 1;
        # w_gate_up None; input_norm, post_attention_norm and fast from `full`; keep the
        # group
        self.attention = ShardedAttention(full.attention, heads, group)
        self.w_gate = output_rows(full.w_gate, *hidden)
        self.w_up = output_rows(full.w_up, *hidden)
        self.w_down = input_columns(full.w_down, *hidden)
        self.w_gate_up = None
        self.input_norm = full.input_norm
        self.post_attention_norm = full.post_attention_norm
        self.fast = full.fast
        self.group = group

    def mlp(self, y: mx.array) -> mx.array:
        """y: [B, L, E] -> [B, L, E]: this rank's hidden units through its columns of
        w_down give a partial sum; all_sum adds every rank's part. With
        ShardedAttention.project_out, the block's two sums over the ranks: forward
        is the parent's."""
        # Week 4 Day 1 Task 2: mlp: Qwen2BlockWeek2.mlp on this rank's slices (a partial
        # sum), then mx.distributed.all_sum over the group
        return mx.distributed.all_sum(super().mlp(y), group=self.group)


class ShardedQwen2Model(Qwen2ModelWeek2):
    """Qwen2ModelWeek2 split over the ranks of `group` (default: mx.distributed.init(),
    a group of one when the script was not started by mlx.launch).

    Same calls and attributes as Qwen2ModelWeek2; layers are ShardedBlocks, so
    create_kv_cache's caches hold this rank's KV heads only. The hidden units are
    shard_range(args.intermediate_size, size, rank, group_unit(down_proj)): whole
    quantization groups of the first layer's w_down (1 for a dense one). Every rank
    must make every call, with the same tokens, offsets and shapes: each layer's
    all_sums wait for all ranks. Each rank loads the whole checkpoint and keeps its slices.
    """

    def __init__(
        self,
        mlx_model: nn.Module,
        group: mx.distributed.Group | None = None,
        weights: str = "auto",
        use_fast_kernels: bool = False,
    ):
        # Week 4 Day 1 Task 2: ShardedQwen2Model: Qwen2ModelWeek2's __init__; group (or
        # mx.distributed.init()), rank and size; this rank's HeadShard (shard_heads)
        # and hidden units (shard_range over intermediate_size, in whole quantization
        # groups of down_proj); every layer replaced by its ShardedBlock
        super().__init__(mlx_model, weights, use_fast_kernels)
        self.group = mx.distributed.init() if group is None else group
        self.rank, self.size = self.group.rank(), self.group.size()
        args = self.args
        self.heads = shard_heads(
            args.num_attention_heads, args.num_key_value_heads, self.size
        )[self.rank]
        unit = group_unit(self.layers[0].w_down)
        self.hidden = shard_range(args.intermediate_size, self.size, self.rank, unit)
        # The slices are lazy: a whole layer's weights are computed only while its
        # slices are first evaluated, then freed.
        self.layers = [
            ShardedBlock(block, self.heads, self.hidden, self.group)
            for block in self.layers
        ]
