import numpy as np, sys
W=np.load('/tmp/v/W.npy')     # [V, 640] exact head
K=64
def q4(M,block):
    n,k=M.shape; B=M.reshape(n,k//block,block); s=np.abs(B).max(axis=2,keepdims=True)/7+1e-30
    return (np.clip(np.rint(B/s),-8,7)*s).reshape(n,k).astype(np.float32)
def q8rows(M,rng=127):
    s=np.abs(M).max(axis=1,keepdims=True)/rng+1e-30
    return (np.clip(np.rint(M/s),-rng,rng)*s).astype(np.float32)
def qact(h):
    s=np.abs(h).max(axis=1,keepdims=True)/127+1e-30; return (np.rint(h/s)*s).astype(np.float32)
def evaluate(H, approx, label):
    hit1=hit5=0; kl=[]; tv=[]
    for i in range(0,len(H),128):
        h=H[i:i+128]; L=h@W.T; A=approx(h)
        cand=np.argpartition(-A,K,axis=1)[:,:K]
        top5=np.argpartition(-L,5,axis=1)[:,:5]; top1=L.argmax(1)
        M=A.copy(); np.put_along_axis(M,cand,np.take_along_axis(L,cand,1),1)
        for j in range(len(h)):
            s=set(cand[j].tolist()); hit1+= top1[j] in s; hit5+= all(x in s for x in top5[j])
        lp=L-L.max(1,keepdims=True); lp=lp-np.log(np.exp(lp).sum(1,keepdims=True))
        lq=M-M.max(1,keepdims=True); lq=lq-np.log(np.exp(lq).sum(1,keepdims=True))
        p=np.exp(lp); kl+=list((p*(lp-lq)).sum(1)); tv+=list(0.5*np.abs(p-np.exp(lq)).sum(1))
    kl=np.array(kl); tv=np.array(tv)
    print(f"{label:40s} top1 {hit1/len(H):.4f} top5 {hit5/len(H):.4f} KL mean {kl.mean():.4f} p99 {np.quantile(kl,.99):.4f} TV mean {tv.mean():.4f} max {tv.max():.3f}", flush=True)
cal=np.load('/tmp/pca/'+sys.argv[1]+'.npy')
ev,V=np.linalg.eigh(cal.T.astype(np.float64)@cal); o=np.argsort(-ev); ev=ev[o]; V=V[:,o].astype(np.float32)
print("calib",sys.argv[1],cal.shape,"energy", {r: round(float(ev[:r].sum()/ev.sum()),4) for r in (128,192,256,320,384)})
for tname in sys.argv[2].split(','):
    H=np.load(f'/tmp/pca/{tname}.npy')
    print("== test", tname, H.shape)
    Wc4=q4(W,128); evaluate(H, lambda h: qact(h)@Wc4.T, "now: int4 b128, 1 row")
    Wc8=q8rows(W,63); evaluate(H, lambda h: qact(h)@Wc8.T, "now: int8 rows 7-bit, 8 rows")
    for r in [int(x) for x in sys.argv[3].split(',')]:
        P=V[:,:r]; WP=W@P
        evaluate(H, lambda h: (h@P)@WP.T, f"rank {r} fp32")
        Wq=q4(WP,32 if r%64 else 64); evaluate(H, lambda h: qact(h@P)@Wq.T, f"rank {r} int4")
        Wq8=q8rows(WP,63); evaluate(H, lambda h: qact(h@P)@Wq8.T, f"rank {r} int8 rows 7-bit")
