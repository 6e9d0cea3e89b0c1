"""Calculet: compile LLMs into static prefill/decode graphs (a calbin) and serve them on ONNX Runtime."""

__version__ = "0.1.0"
