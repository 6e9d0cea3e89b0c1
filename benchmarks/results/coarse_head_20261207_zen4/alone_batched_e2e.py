"""Greedy continuations of the 16 reference passages, each prompt alone and all 16 at once (8 lanes):
the tokens a user gets must not depend on what else the server runs."""
import sys
from calculet.llm import LLM
from calculet.engine.params import SamplingParams
from calculet.reference.texts import PASSAGES
llm = LLM(sys.argv[1], threads=2, prefix_cache=False)
sp = SamplingParams(max_tokens=int(sys.argv[2]), temperature=0.0, ignore_eos=True)
prompts = [t for _, t in PASSAGES]
alone = [llm.generate(p, sp)[0].outputs[0].token_ids for p in prompts]
batched = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
diff = [(PASSAGES[i][0], next(j for j, (a, b) in enumerate(zip(alone[i], batched[i])) if a != b))
        for i in range(len(prompts)) if list(alone[i]) != list(batched[i])]
print(f"{sys.argv[1]}: {len(diff)} of {len(prompts)} passages continue differently alone and batched (name, first step): {diff}")
llm.close()
