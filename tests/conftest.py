"""Shared fixtures: tiny random models per architecture and their calbins, and the default model's calbin.

Everything is built inside the test session (nothing downloaded) and cached for the session.
Tests import helpers from this folder (`import tiny_models`), which pytest puts on sys.path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tiny_models


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(arch) -> a tiny HF folder: built here with torch, or, in an environment without
    torch (the OpenVINO and CUDA ones), taken from $CALCULET_TINY_MODELS/arch (tests/tiny_models.py DIR ...)."""
    made = {}
    prebuilt = os.environ.get("CALCULET_TINY_MODELS")

    def get(arch: str):
        if arch not in made:
            if prebuilt and (Path(prebuilt) / arch / "config.json").is_file():
                made[arch] = Path(prebuilt) / arch
            else:
                made[arch] = tiny_models.make_tiny_model(arch, tmp_path_factory.mktemp(f"hf-{arch}"))
        return made[arch]

    return get


@pytest.fixture(scope="session")
def tiny_calbin(tiny_model_dir, tmp_path_factory):
    """tiny_calbin(arch, lanes=4, context=64, chunks=(4, 16), golden=False, weights="fp32", target="cpu", chips=1,
    partition="", kv_dtype="fp32") -> calbin path."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    made = {}

    def get(arch: str, lanes: int = 4, context: int = 64, chunks=(4, 16), golden: bool = False, weights: str = "fp32",
            target: str = "cpu", chips: int = 1, partition: str = "", kv_dtype: str = "fp32"):
        key = (arch, lanes, context, tuple(chunks), golden, weights, target, chips, partition, kv_dtype)
        if key not in made:
            out = tmp_path_factory.mktemp(f"calbin-{arch}") / "model.calbin"
            options = CompileOptions(lanes=lanes, context=context, prefill_chunks=tuple(chunks), golden=golden, weights=weights,
                                     target=target, chips=chips, partition=partition, kv_dtype=kv_dtype)
            made[key] = compile_calbin(str(tiny_model_dir(arch)), out, options, log=lambda _m: None)
        return made[key]

    return get


@pytest.fixture(scope="session")
def default_calbin(tmp_path_factory):
    """The embedded default model (Gemma 3 270M) as `calculet serve` runs it on a VNNI CPU: default
    weight policy (named, not `auto`, so the numerics tests do not depend on the CPU's ISA), 8 lanes,
    context 1024, with golden/."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    out = tmp_path_factory.mktemp("calbin-default") / "gemma3-270m.calbin"
    return compile_calbin(None, out, CompileOptions(lanes=8, context=1024, weights="default"), log=print)


@pytest.fixture(scope="session")
def default_calbin_fp32(tmp_path_factory):
    """The default model with fp32 weights (the numerical parity build), 2 lanes, context 1024 (past
    the sliding window of 512: the 15 local layers keep KV rings), no golden/."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    out = tmp_path_factory.mktemp("calbin-default-fp32") / "gemma3-270m-fp32.calbin"
    return compile_calbin(None, out, CompileOptions(lanes=2, context=1024, weights="fp32", golden=False), log=print)


@pytest.fixture(scope="session")
def default_calbin_two_chips(tmp_path_factory):
    """partition ("tp" or "pp") -> the default model's fp32 parity build compiled for 2 chips, each
    compiled once per session (the in-process and the served two-chip tests share them)."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    built: dict[str, Path] = {}

    def build(partition: str) -> Path:
        if partition not in built:
            out = tmp_path_factory.mktemp(f"calbin-default-{partition}") / "gemma3-270m-fp32.calbin"
            built[partition] = compile_calbin(None, out, CompileOptions(lanes=2, context=1024, weights="fp32", golden=False,
                                                                        chips=2, partition=partition), log=print)
        return built[partition]
    return build


@pytest.fixture(scope="session")
def default_reference():
    """transformers' Gemma 3 holding the default GGUF's tensors (fp32, eager attention), built once for
    the session: the end-to-end and long-context tests compare against the same model."""
    from calculet.reference.hf import build_reference_model
    from calculet.sources.resolve import load_source

    return build_reference_model(load_source(None))
