"""One verify-attention call (for Nsight Compute): 2 requests, 16 heads, 32k prefix, 256-node trees."""
import numpy as np, torch
import driverlevel as dl
from driverlevel.verify_attention import VerifyAttention, VerifyMetadata
from driverlevel.reference.trees import build_mask, random_tree

heads, bs, prefix, ntok = 16, 2, 32768, 256
dev = dl.Device(0); st = dev.create_stream()
num_slots = bs * (prefix + ntok) + 64
kv = torch.randn(num_slots, 576, dtype=torch.bfloat16, device="cuda")
q = torch.randn(bs * ntok, heads, 576, dtype=torch.bfloat16, device="cuda")
perm = torch.randperm(num_slots, device="cuda")
meta = VerifyMetadata(torch.arange(bs + 1, device="cuda") * ntok, (torch.arange(bs + 1, device="cuda") * prefix).to(torch.int32),
                      perm[: bs * prefix].contiguous(), perm[bs * prefix: bs * prefix + bs * ntok].contiguous())
plan = VerifyAttention(dev, heads, max_batch=bs, max_q=ntok, num_splits=1)
m, _ = build_mask([random_tree(ntok, np.random.default_rng(b)) for b in range(bs)], [prefix] * bs, "bitmask", words_per_token=plan.mask_words)
meta.custom_mask = torch.from_numpy(m.view(np.int32)).cuda()
out = torch.empty(bs * ntok, heads, 512, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
for _ in range(2):
    plan.run(st, q, kv, meta, out)
st.synchronize()
print("done", plan)
