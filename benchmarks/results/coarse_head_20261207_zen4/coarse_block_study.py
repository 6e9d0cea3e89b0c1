import numpy as np, sys
W=np.load('/tmp/v/W.npy')
def q4(M,block):
    n,k=M.shape; B=M.reshape(n,k//block,block); s=np.abs(B).max(axis=2,keepdims=True)/7+1e-30
    return (np.clip(np.rint(B/s),-8,7)*s).reshape(n,k).astype(np.float32)
def qactb(h,block):
    n,k=h.shape; B=h.reshape(n,k//block,block); s=np.abs(B).max(axis=2,keepdims=True)/127+1e-30
    return (np.rint(B/s)*s).reshape(n,k).astype(np.float32)
H=np.load('/tmp/pca/passages.npy')
L=np.concatenate([H[i:i+128]@W.T for i in range(0,len(H),128)])
top1=L.argmax(1); srt=np.argsort(-L,axis=1)[:,:5]
for block in (128,64,32):
    Wq=q4(W,block)
    A=np.concatenate([qactb(H[i:i+128],block)@Wq.T for i in range(0,len(H),128)])
    rank_of_top1=(A>np.take_along_axis(A,top1[:,None],1)).sum(1)
    for K in (64,128,256):
        cand=np.argpartition(-A,K,axis=1)[:,:K]
        hit1=np.mean([top1[j] in set(cand[j]) for j in range(len(H))])
        hit5=np.mean([all(x in set(cand[j]) for x in srt[j]) for j in range(len(H))])
        print(f"int4 b{block} K{K}: top1 {hit1:.4f} top5 {hit5:.4f}  worst coarse rank of the top token {rank_of_top1.max()}", flush=True)
    gap=np.sort(L,1)[:,-1]-np.sort(L,1)[:,-2]
    miss=rank_of_top1>=64
    print("  misses at K64:", miss.sum(), "their exact top1-top2 gaps", np.round(gap[miss],3)[:10], "coarse err std", float((A-L).std()))
