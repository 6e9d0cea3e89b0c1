"""What every gate reads: the calbin folder, its manifest as raw JSON, and lazily loaded pieces.

Gates A and B work on the raw JSON (a broken manifest must still be judged, not crash a parser);
later gates read only the typed `Manifest`, set once gate B has shown it parses. ONNX graphs are loaded
once, without their external weights, and shared by gates C and E.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from calculet.calbin.manifest import Manifest
from calculet.calbin.validate_report import ValidationOptions


def inside(folder: Path, rel: str) -> bool:
    """True when `rel` is a relative path that stays inside `folder` (no '..', no link out)."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\\" in rel:
        return False
    return (folder / rel).resolve().is_relative_to(folder.resolve())


@dataclass
class GateContext:
    folder: Path
    raw: dict                           # manifest.json as parsed JSON
    options: ValidationOptions
    manifest: Manifest | None = None    # set after gate B when the manifest parses into the typed schema
    kv_layers: tuple[int, ...] | None = None   # a chip sub-calbin's model layers in its KV layout's order
                                               # (gate P sets it: pp chips hold a range); None: 0..layers-1
    _onnx: dict = field(default_factory=dict)       # file -> ModelProto or the load error (str)
    _tokenizer: dict | None = None
    _tokenizer_error: str | None = None

    # --- raw-manifest helpers for gates A and B (never raise on a malformed manifest) -------
    def section(self, key: str) -> dict:
        value = self.raw.get(key)
        return value if isinstance(value, dict) else {}

    def graphs(self) -> list[dict]:
        value = self.raw.get("graphs")
        return [g for g in value if isinstance(g, dict)] if isinstance(value, list) else []

    # --- lazily loaded pieces ------------------------------------------------------------
    def onnx_model(self, rel: str):
        """The graph at `rel` (relative to the calbin) loaded without external data, or None; see onnx_error."""
        if rel not in self._onnx:
            import onnx

            path = self.folder / rel
            if not inside(self.folder, rel):
                self._onnx[rel] = f"{rel}: the path leaves the calbin folder"
                return None
            try:
                self._onnx[rel] = onnx.load(str(path), load_external_data=False)
            except FileNotFoundError:
                self._onnx[rel] = f"{rel}: file not found"
            except Exception as exc:  # onnx raises DecodeError and others for a corrupt file
                self._onnx[rel] = f"{rel}: not a readable ONNX model ({type(exc).__name__}: {exc})"
        value = self._onnx[rel]
        return None if isinstance(value, str) else value

    def onnx_error(self, rel: str) -> str | None:
        self.onnx_model(rel)
        value = self._onnx[rel]
        return value if isinstance(value, str) else None

    def tokenizer_json(self) -> dict | str:
        """tokenizer.json parsed, or a string saying why it could not be read."""
        if self._tokenizer is None and self._tokenizer_error is None:
            rel = self.manifest.tokenizer.file if self.manifest is not None else "tokenizer.json"
            if not inside(self.folder, rel):
                self._tokenizer_error = f"{rel}: the path leaves the calbin folder"
                return self._tokenizer_error
            try:
                data = json.loads((self.folder / rel).read_text(encoding="utf-8"))
            except FileNotFoundError:
                self._tokenizer_error = f"{rel}: file not found"
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                self._tokenizer_error = f"{rel}: not valid JSON ({exc})"
            else:
                if isinstance(data, dict):
                    self._tokenizer = data
                else:
                    self._tokenizer_error = f"{rel}: the top level is {type(data).__name__}, not an object"
        return self._tokenizer if self._tokenizer is not None else self._tokenizer_error
