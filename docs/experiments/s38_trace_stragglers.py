"""Stragglers of a decode step from a trace dump (s38-decode-trace.py --out): per CTA its key blocks, first and last
block landed, split and SM (HEAD trace diff layout: 16 events, 320 CTAs). Usage: s38_trace_stragglers.py DUMP NHEADS_KV."""
import numpy as np, struct, sys
K_EVENTS,K_SLOTS,K_MAX=16,16,320
W=2*K_EVENTS
raw=open(sys.argv[1],'rb').read()
nheads=int(sys.argv[2])
words=K_SLOTS*K_MAX*W; unit=4+8*(words+1)
bufs=[]
for off in range(0,len(raw),unit):
    kind=struct.unpack_from('i',raw,off)[0]
    rec=np.frombuffer(raw,dtype=np.uint64,count=words,offset=off+4).reshape(K_SLOTS,K_MAX,W).astype(np.int64)
    t=struct.unpack_from('Q',raw,off+4+8*words)[0]
    if t>0: bufs.append((kind,t,rec))
att=[b for b in bufs if b[0]==0][0][2]
launches=[]
for s in range(K_SLOTS):
    ctas=int(att[s,0,K_EVENTS+14])
    if ctas<=0 or ctas>K_MAX: continue
    r=att[s,:ctas]
    if (r[:,0]==0).any(): continue
    launches.append((r[:,0].min(),r))
launches.sort(key=lambda x:x[0])
last=launches[-8:]
allrows=[]
for li,(t0,r) in enumerate(last[1:-1]):
    g=r[:,:K_EVENTS]-t0
    ctas=r.shape[0]
    idx=np.arange(ctas); head=idx%nheads; split=idx//nheads
    for c in range(ctas): allrows.append((li,head[c],split[c],r[c,15],r[c,14],g[c,6],g[c,7],g[c,9]))
a=np.array(allrows,dtype=np.float64)
print("layers",len(last)-2,"CTA rows",len(a))
for nb in sorted(set(a[:,3])):
    m=a[:,3]==nb
    print(f"blocks {nb:.0f}: n={m.sum()}, stream end median {np.median(a[m,6]):.0f} p90 {np.percentile(a[m,6],90):.0f} max {a[m,6].max():.0f}; first landed median {np.median(a[m,5]):.0f}")
per=(a[:,6]-a[:,5])/(a[:,3]-1)
print("per-block interval median %.0f p10 %.0f p90 %.0f ns"%(np.median(per),np.percentile(per,10),np.percentile(per,90)))
thr=np.percentile(a[:,6],90)
s=a[:,6]>=thr
print("slowest 10%%: first landed median %.0f (others %.0f); per-block %.0f (others %.0f); 9-block share %.2f (all %.2f)"%(np.median(a[s,5]),np.median(a[~s,5]),np.median(per[s]),np.median(per[~s]),(a[s,3]==a[:,3].max()).mean(),(a[:,3]==a[:,3].max()).mean()))
for sp in sorted(set(a[:,2]))[:3]+sorted(set(a[:,2]))[-3:]:
    m=a[:,2]==sp
    print(f"split {sp:.0f}: end median {np.median(a[m,6]):.0f}, blocks {np.unique(a[m,3])}")
# CTA pairs on one SM: does sharing matter? count CTAs per SM per layer
for li in range(int(a[:,0].max())+1)[:1]:
    m=a[:,0]==li
    sms,cnt=np.unique(a[m,4],return_counts=True)
    print("layer",li,"CTAs per SM distribution:",dict(zip(*np.unique(cnt,return_counts=True))))
    # end time for CTAs alone on SM vs paired
    alone=set(sms[cnt==1])
    e_alone=[x[6] for x in a[m] if x[4] in alone]; e_pair=[x[6] for x in a[m] if x[4] not in alone]
    print("  stream end median alone %.0f (n=%d), shared %.0f (n=%d)"%(np.median(e_alone) if e_alone else -1,len(e_alone),np.median(e_pair),len(e_pair)))
# correlation of end with per-block and first
print("corr(end, first) %.2f corr(end, per-block) %.2f"%(np.corrcoef(a[:,6],a[:,5])[0,1],np.corrcoef(a[:,6],per)[0,1]))
