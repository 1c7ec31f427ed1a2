"""Issue 42 prototype (not part of infersched): a lower bound on the mean latency of an
offline workload from the batch-index identity (docs/design/milp.md, "The batch-index
identity ..." and "Promising, to be built: ..."), by the dual of the local-polytope LP of
its pairwise problem, solved by MPLP message passing, completion batches grouped in bins.

Cost model: llama2-7b-a100's coefficients (per layer x 32, seconds), C from argv[4]
(default 2,048). Prints the bound on the mean latency every 20 sweeps (valid at each).

usage: python3 phi_mplp.py WORKLOAD.csv BIN_WIDTH SWEEPS [C]    (needs numpy)
  e.g. infersched workload sample --trace notebooks-data/traces/arxiv_summarization.csv \
         --random 32 --seed 0 --max-total-tokens 4096 --arrival static --out c32.csv
       python3 phi_mplp.py c32.csv 20 160
"""
import csv, math, sys, time
import numpy as np
one=2.07552e-3; tok=6.112e-5; dkv=2.72416e-7; attn=5.36736e-9; ctx=2.95168e-7; npf=4.9088e-5; ndec=2.368e-5; hp=2.9632e-3; hd=6.1472e-4
C=int(sys.argv[4]) if len(sys.argv)>4 else 2048
b=one+min(hp,hd); s=max(hp-hd,0)
reqs=[(int(r['num_prefill_tokens']),int(r['num_decode_tokens'])) for r in csv.DictReader(open(sys.argv[1]))]
W_BIN=int(sys.argv[2]); SWEEPS=int(sys.argv[3])
n=len(reqs)
def prompt_work(p):
    return 0 if p<=0 else tok*p+attn*p*p+npf+s*p/C
F=[];NB=[];W=[]
for I,O in reqs:
    ch=math.ceil(I/C); nb=ch+O-1
    f=[0.0]
    for e in range(1,ch+1):
        f.append(prompt_work(I-(ch-e)*C))
    for k in range(1,O):
        f.append(f[-1]+tok+ndec+dkv*(I+k))
    F.append(f);NB.append(nb);W.append(f[-1])
# Any c with some c_j > Phi(nb)/b has Phi above Phi(nb): the minimizer has every c_j <= HMAX.
def phi(c):
    tot=0.0
    for j in range(n):
        tot+=b*c[j]+W[j]
        for i in range(n):
            if i==j: continue
            d=c[i]-c[j]
            tot+= W[i] if d<=0 else (F[i][NB[i]-d] if NB[i]-d>0 else 0.0)
    return tot
HMAX=int(phi(NB)/b)+1
# bins: uniform W_BIN up to sum NB, then doubling widths up to HMAX
edges_b=[0]
while edges_b[-1]<sum(NB): edges_b.append(edges_b[-1]+W_BIN)
w=W_BIN
while edges_b[-1]<HMAX: w*=2; edges_b.append(edges_b[-1]+w)
lo=np.array(edges_b[:-1]); hi=np.array(edges_b[1:])-1
nbins=len(lo)
INF=1e9
U=np.zeros((n,nbins))
for i in range(n):
    U[i]=np.where(hi<NB[i],INF,b*np.maximum(lo,NB[i]))+W[i]
def g(i,d):
    if d<=0: return W[i]
    e=NB[i]-d
    return F[i][e] if e>0 else 0.0
def pair_table(i,j):
    # p(d) = g_i(d) + g_j(-d), constant W_i for d <= -NB_j and W_j for d >= NB_i
    dlo=-NB[j]; dhi=NB[i]
    D=np.arange(dlo,dhi+1)
    pd=np.array([g(i,int(d))+g(j,int(-d)) for d in D])
    # sparse table for range minima
    sp=[pd]; k=1
    while 2*k<=len(pd):
        prev=sp[-1]; sp.append(np.minimum(prev[:-k],prev[k:])); k*=2
    a=(lo[:,None]-hi[None,:]); z=(hi[:,None]-lo[None,:])   # d range per (p,q)
    ac=np.clip(a,dlo,dhi)-dlo; zc=np.clip(z,dlo,dhi)-dlo
    L=zc-ac+1; lev=np.floor(np.log2(L)).astype(int)
    out=np.empty((nbins,nbins))
    for lv in range(len(sp)):
        m=lev==lv
        if not m.any(): continue
        arr=sp[lv]
        out[m]=np.minimum(arr[ac[m]],arr[zc[m]-(1<<lv)+1])
    return out
t0=time.time()
edges=[(i,j) for i in range(n) for j in range(i+1,n)]
T={e:pair_table(*e) for e in edges}
print('HMAX',HMAX,'bins',nbins,'tables',round(time.time()-t0,1),'s',file=sys.stderr,flush=True)
lam_i={e:np.zeros(nbins) for e in edges}; lam_j={e:np.zeros(nbins) for e in edges}
B=[U[i].copy() for i in range(n)]
def bound(): return sum(B[i].min() for i in range(n))
for sw in range(SWEEPS):
    for e in edges:
        i,j=e
        ai=B[i]-lam_i[e]; aj=B[j]-lam_j[e]
        Tij=T[e]
        mi=np.min(Tij+aj[None,:],axis=1)
        mj=np.min(Tij+ai[:,None],axis=0)
        new_i=-0.5*ai+0.5*mi; new_j=-0.5*aj+0.5*mj
        B[i]=ai+new_i; B[j]=aj+new_j
        lam_i[e]=new_i; lam_j[e]=new_j
    if sw%20==19 or sw==SWEEPS-1:
        print('sweep',sw+1,'bound mean',round(bound()/n,4),'t',round(time.time()-t0,1),flush=True)
