"""The numerics bring-up toolkit: is a compiled model's output acceptable, and where does it break?

- `walk`: runs prompts on a runtime `Device` and yields full logits rows, teacher-forced.
- `compare`: a calbin (or two) against a reference set (`reference.sets`): agreement, first
  divergence, top-k overlap, logits cosine / max-abs, logprob error; thresholds for CI.
- `perplexity`: sliding-window perplexity of a calbin or of the transformers reference.
- `probe`: per-module hidden states of a `--probes` build against the reference's forward hooks;
  names the first module whose error jumps.
- `cli`: `calculet reference make`, `calculet compare`, `calculet eval perplexity`.
"""
