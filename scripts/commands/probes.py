"""What a package has built: each probe runs one day's function and says on stderr
what is missing when it raises NotImplementedError, so a learner's package runs
with the newest days it has (the policy, the KV cache, speculation, jump-forward)."""

import sys


def has_built(package, probe, missing: str) -> bool:
    """Does probe(package) run, that is, has the learner built the day it needs?
    When not, says on stderr that the package has no `missing`."""
    try:
        probe(package)
    except NotImplementedError:
        print(f"{package.__name__}: no {missing}", file=sys.stderr)
        return False
    return True


def has_speculation(package) -> bool:
    """Has the package week 3 day 4 (prompt lookup runs)?"""
    return has_built(
        package,
        lambda p: p.find_drafts([1, 1], 1, 1, 1),
        "speculative decoding (week 3 day 4)",
    )


def has_jump_forward(package) -> bool:
    """Has the package week 3 day 5's forced text (Dfa.forced_text runs)?"""
    return has_built(
        package,
        lambda p: p.compile_choices(["a"]).forced_text(0, 1),
        "jump-forward (week 3 day 5)",
    )


def newest_policy(package, asked: str | None) -> str:
    """The policy to run: `asked` if given, else "mixed" when `package` has week 3
    day 1 (its MixedPolicy's plan and step limits run) and "alternate" when not yet
    (said on stderr)."""
    if asked is not None:
        return asked
    from types import SimpleNamespace

    try:
        planner = package.Planner(package.EngineConfig(policy="mixed"), kv=None)
        policy = package.MixedPolicy(planner)
        policy.plan()
        policy.chunk_limit(SimpleNamespace(prefill_length=0, offset=0), 1)
    except NotImplementedError:
        print(
            f"{package.__name__}: policy alternate (the mixed step is week 3 day 1)",
            file=sys.stderr,
        )
        return "alternate"
    return "mixed"


def newest_kv_cache(
    package, asked: str | None, prefix_caching: bool = True
) -> tuple[str, bool]:
    """(KV cache, prefix caching) to run: the KV cache `asked` if given, else "paged"
    when `package` has built week 3 day 2's block pool and "dense" when not yet;
    prefix caching as asked where the package has week 3 day 3's lookup. A
    fallback is said on stderr."""
    try:
        pool = package.BlockPool(1, 1)
    except NotImplementedError:
        if asked is None:
            print(
                f"{package.__name__}: dense KV cache (the paged one is week 3 day 2)",
                file=sys.stderr,
            )
            return "dense", False
        return asked, prefix_caching
    kv_cache = asked or "paged"
    if kv_cache == "paged" and prefix_caching:
        try:
            pool.lookup([])
        except NotImplementedError:
            print(
                f"{package.__name__}: no prefix caching (it is week 3 day 3)",
                file=sys.stderr,
            )
            return kv_cache, False
    return kv_cache, prefix_caching
