"""Calculet: compile LLMs into static prefill/decode graphs (a calbin) and serve them on ONNX Runtime.

    from calculet import LLM, SamplingParams     # the Python API (calculet/llm.py)

The API names load on first use, so `import calculet` stays light (the CLI imports it too).
"""

__version__ = "0.1.0"

_LAZY = {
    "LLM": "calculet.llm",
    "LLMOptions": "calculet.llm",
    "SamplingParams": "calculet.engine.params",
    "RequestOutput": "calculet.engine.outputs",
    "CompletionOutput": "calculet.engine.outputs",
    "Usage": "calculet.engine.outputs",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'calculet' has no attribute {name!r}")
