"""python heads_alone_vs_batched.py CALBIN HIDDEN.npy (hidden states from collect_hidden.py).

The served calbin's own head graphs on hidden states of the multilingual/code passages:
does head_1 (1 row) pick the same greedy token as head_8 (8 rows) and as the exact product?"""
import numpy as np, onnxruntime as ort, sys
cb=sys.argv[1]; H=np.load(sys.argv[2]); W=np.load('/tmp/v/W.npy')
so=ort.SessionOptions(); so.intra_op_num_threads=2
s1=ort.InferenceSession(f'{cb}/graphs/head_1.onnx',so,providers=['CPUExecutionProvider'])
s8=ort.InferenceSession(f'{cb}/graphs/head_8.onnx',so,providers=['CPUExecutionProvider'])
n=len(H)//8*8; H=H[:n]
t1=[];v1=[];t8=[];v8=[]
for i in range(n):
    o=s1.run(['topk_ids','topk_values'],{'hidden':H[i:i+1]}); t1.append(o[0][0]); v1.append(o[1][0])
for i in range(0,n,8):
    o=s8.run(['topk_ids','topk_values'],{'hidden':H[i:i+8]}); t8+=list(o[0]); v8+=list(o[1])
t1=np.array(t1); t8=np.array(t8); v1=np.array(v1); v8=np.array(v8)
ex=np.concatenate([H[i:i+128]@W.T for i in range(0,n,128)]).argmax(1)
print("positions",n)
print("greedy head_1 != head_8:", int((t1[:,0]!=t8[:,0]).sum()))
print("head_1 top != W top:", int((t1[:,0]!=ex).sum()), " head_8 top != W top:", int((t8[:,0]!=ex).sum()))
d=np.where(t1[:,0]!=t8[:,0])[0]
for j in d[:12]:
    print(f"  pos {j}: head_1 {t1[j,0]} ({v1[j,0]:.3f}) head_8 {t8[j,0]} ({v8[j,0]:.3f}) exact {ex[j]}; head_8's token in head_1's 64: {t8[j,0] in set(t1[j])}")
