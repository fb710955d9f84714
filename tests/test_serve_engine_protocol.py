"""The engine the server drives is declared (tiny_llm_serve.ServedEngine): the
package's Engine and the tests' doubles each state every member it names, so the
server never has to probe for one."""

import inspect

from tiny_llm_serve import ServedEngine

from .servers import BrokenEngine, HeldEngine
from .solution import tiny

# The arguments the engine loop passes to each method.
CALLS = {
    "add_request": (object(),),
    "abort": (0, None),
    "has_unfinished": (),
    "step": (),
    "snapshot": (),
    "close": (),
}


def test_the_protocol_declares_what_the_loop_calls():
    methods = {
        name
        for name, value in vars(ServedEngine).items()
        if callable(value) and not name.startswith("_")
    }
    assert methods == set(CALLS)
    assert set(ServedEngine.__annotations__) == {
        "config",
        "model",
        "tokenizer",
        "metrics",
    }


def test_the_package_engine_takes_every_call_of_the_loop():
    for name, args in CALLS.items():
        method = getattr(tiny.Engine, name)
        inspect.signature(method).bind(None, *args)  # raises if the loop's call fails


def test_the_doubles_state_every_member():
    broken = BrokenEngine(tokenizer=object(), vocab_size=10)
    for engine in (broken, HeldEngine(broken)):
        for name in ServedEngine.__annotations__:
            assert name in vars(engine) or name in vars(type(engine)), name
        for name, args in CALLS.items():
            assert name in vars(type(engine)), name
            inspect.signature(getattr(engine, name)).bind(*args)
