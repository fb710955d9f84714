"""Loading a model for a command: progress on stderr, the package's newest model
kind, the model's context length and the note about a slow BLAS."""

import sys

from tqdm import tqdm

from scripts.commands.cli import fail

STAGES = {
    "verify": "checking the embedded model file",
    "convert": "converting the GGUF model for MLX",
}
MODEL_KINDS = {
    "week2-fast": "the week 2 model with the KV cache and fast kernels",
    "week2": "the week 2 model with the KV cache and hand-written kernels",
    "week1": "the week 1 model (no KV cache: every token reruns the whole sequence)",
}


def note_slow_blas() -> None:
    """One line on stderr when float32 matmul runs on MLX's slow reference BLAS."""
    from tiny_llm_base.device import gpu_paths
    from tiny_llm_base.fast_blas import STATUS

    if STATUS.hint and not gpu_paths():
        print(f"note: {STATUS.hint}", file=sys.stderr)


def context_length(mlx_model) -> int:
    """The positions the model was trained for: its config's max_position_embeddings."""
    from tiny_llm_base import DEFAULT_MAX_SEQ_LEN

    return getattr(mlx_model.args, "max_position_embeddings", None) or (
        DEFAULT_MAX_SEQ_LEN
    )


class ModelProgress:
    """Renders load_model's progress(stage, done, total) reports on stderr: tqdm bars
    on a terminal; in a pipe or a log, where bars come out as noise, one line a stage.
    """

    def __init__(self) -> None:
        self.bars: dict[str, tqdm] = {}
        self.plain = not sys.stderr.isatty()
        self.said: set[str] = set()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage in ("rebuild", "replace-file", "wait"):
            print(self.announcement(stage), file=sys.stderr)
            return
        if self.plain:
            if stage not in self.said:
                self.said.add(stage)
                print(self.plain_line(stage, total), file=sys.stderr, flush=True)
            return
        if stage not in self.bars:
            unit = "B" if stage == "verify" else "tensor"
            self.bars[stage] = tqdm(
                total=total,
                desc=STAGES.get(stage, stage),
                unit=unit,
                unit_scale=stage == "verify",
                leave=False,
            )
        bar = self.bars[stage]
        bar.update(done - bar.n)

    @staticmethod
    def plain_line(stage: str, total: int) -> str:
        if stage == "verify":
            return f"{STAGES[stage]} ({total / 1e6:.0f} MB)"
        if stage == "convert":
            from tiny_llm_base.embedded_model import MODEL_DIR_NAME, default_models_dir

            folder = default_models_dir() / MODEL_DIR_NAME
            return (
                f"{STAGES[stage]} into {folder} ({total} tensors): once, on first use"
            )
        return STAGES.get(stage, stage)

    @staticmethod
    def announcement(stage: str) -> str:
        from tiny_llm_base.embedded_model import MODEL_DIR_NAME, default_models_dir

        folder = default_models_dir() / MODEL_DIR_NAME
        if stage == "rebuild":
            return (
                f"the converted model folder {folder} is incomplete, damaged or from "
                "an older tiny-llm: rebuilding it"
            )
        if stage == "replace-file":
            return f"{folder} is a file, not the converted model folder: replacing it"
        return (
            f"another process is converting the embedded model into {folder}: waiting"
        )

    def __enter__(self) -> "ModelProgress":
        return self

    def __exit__(self, *exc) -> None:
        for bar in self.bars.values():
            bar.close()


def load_model_or_exit(name: str | None):
    """load_model with progress bars; a model that cannot be loaded exits with status 1."""
    from tiny_llm_base import EmbeddedModelError, ModelLoadError, load_model

    try:
        with ModelProgress() as progress:
            return load_model(name, progress=progress)
    except (ModelLoadError, EmbeddedModelError) as error:
        fail(str(error), status=1)


def build_model(package, mlx_model, kind: str):
    """`package`'s model of `kind` (a MODEL_KINDS key), after one token through it.

    The token raises NotImplementedError where the learner has not written that day
    yet, and dequantizes the lazily loaded weights before anything is timed; then
    the weights move onto huge pages where the system offers them (huge_pages.py).
    """
    import mlx.core as mx

    from tiny_llm_base.huge_pages import arrays_of, back_with_huge_pages

    token = mx.array([[0]])
    if kind == "week1":
        model = package.Qwen2ModelWeek1(mlx_model)
        mx.eval(model(token))
    else:
        fast = kind == "week2-fast"
        model = package.Qwen2ModelWeek2(mlx_model, use_fast_kernels=fast)
        mx.eval(model(token, 0, model.create_kv_cache()))
    back_with_huge_pages(arrays_of(model))
    return model


def newest_model(package, mlx_model, kinds: list[str]):
    """(model, kind) for the first of `kinds` that `package` runs; says which on stderr.

    Exits with status 1 and the last NotImplementedError when none runs yet.
    """
    for kind in kinds:
        try:
            model = build_model(package, mlx_model, kind)
        except NotImplementedError as error:
            if kind == kinds[-1]:
                fail(f"not implemented yet in src/tiny_llm: {error}", status=1)
            continue
        print(f"{package.__name__}: {MODEL_KINDS[kind]}", file=sys.stderr)
        return model, kind
