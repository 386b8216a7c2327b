"""DeepSeek-R1's shapes ([DSV3], docs/model.md): hidden 7168, 61 layers (the first 3 dense, FFN
18432), 256 routed experts + 1 shared, top-8, expert FFN 2048, 128 heads, MLA with q_lora_rank
1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, vocab 129280. The generators build
their steps with them; the die model's MLA shape defaults to them."""

HIDDEN = 7168
LAYERS = 61
DENSE_LAYERS = 3
DENSE_FFN = 18432
EXPERT_FFN = 2048
ROUTED_TOP_K = 8
HEADS = 128
Q_LORA = 1536
KV_LORA = 512
QK_NOPE = 128
QK_ROPE = 64
V_HEAD = 128
VOCAB = 129280
