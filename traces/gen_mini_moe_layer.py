"""Generate traces/mini_moe_layer.json: one MoE layer of a decode step on the `mini` system.

Every one of the 32 dies runs two micro-batches on two streams, in the spirit of the
CloudMatrix-Infer decode of docs/machine.md 2.8 (the real generator is issue 6; this is a small,
hand-readable demo of every node type):

- stream 0 (attention, 16 AIC): load the KV cache from HBM, MLA attention, output projection;
- stream 1 (MoE, 8 AIC / 16 AIV): gate, dispatch to 8 expert dies, expert MLP, combine back,
  weighted sum. Micro-batch 1's attention overlaps micro-batch 0's MoE.

Sizes (DeepSeek-R1, docs/machine.md 2.7): 48 tokens per micro-batch per die, KV length 1024, 576 KV
values per token (INT8: 1 B each), top-8 routing with 6 tokens to each destination, dispatch
payload 7.5 KiB per token (INT8 + scale, padded), combine payload 14 KiB per token (BF16).

Run: python traces/gen_mini_moe_layer.py > traces/mini_moe_layer.json
"""
import json

DIES = 32
TOKENS = 48  # per micro-batch per die
KV_LEN = 1024
KV_BYTES_PER_TOKEN = 576  # 512 + 64 INT8 values per token per layer
HEADS = 128
HIDDEN = 7168
EXPERT_FFN = 2048
TOP_K = 8
DISPATCH_BYTES_PER_TOKEN = 7680
COMBINE_BYTES_PER_TOKEN = 14336
STRIDES = (1, 3, 5, 7, 9, 11, 13, 15)  # die d sends to d + s: its twin, its node, the other node


def main():
    nodes = []

    def add(**node):
        node = {"id": len(nodes), **node}
        nodes.append(node)
        return node["id"]

    tokens_per_dest = TOKENS * TOP_K // len(STRIDES)
    for mb in range(2):
        attn_done = {}
        for d in range(DIES):
            kv = add(name=f"kv_load_mb{mb}", type="MEM_LOAD", rank=d, stream=0,
                     attrs={"tensor_size": TOKENS * KV_LEN * KV_BYTES_PER_TOKEN})
            # Absorbed MLA decode: per token and head, QK over 576 values and PV over 512.
            attn = add(name=f"mla_attention_mb{mb}", type="COMP", rank=d, stream=0, data_deps=[kv],
                       attrs={"num_ops": 2 * TOKENS * HEADS * KV_LEN * (576 + 512),
                              "cmemu.unit": "aic", "cmemu.dtype": "bf16", "cmemu.cores": 16})
            attn_done[d] = add(name=f"o_proj_mb{mb}", type="COMP", rank=d, stream=0, data_deps=[attn],
                               attrs={"num_ops": 2 * TOKENS * HEADS * 128 * HIDDEN,
                                      "tensor_size": HEADS * 128 * HIDDEN,
                                      "cmemu.unit": "aic", "cmemu.dtype": "int8", "cmemu.cores": 16})
        for d in range(DIES):
            gate = add(name=f"gate_mb{mb}", type="COMP", rank=d, stream=1, data_deps=[attn_done[d]],
                       attrs={"num_ops": 2 * TOKENS * HIDDEN * 256, "cmemu.unit": "aic",
                              "cmemu.dtype": "bf16", "cmemu.cores": 8})
            for s in STRIDES:
                add(name=f"dispatch_send_mb{mb}_to{(d + s) % DIES}", type="COMM_SEND", rank=d, stream=1,
                    data_deps=[gate],
                    attrs={"comm_dst": (d + s) % DIES, "comm_size": tokens_per_dest * DISPATCH_BYTES_PER_TOKEN,
                           "comm_tag": 2 * mb})
            for s in STRIDES:
                add(name=f"dispatch_recv_mb{mb}_from{(d - s) % DIES}", type="COMM_RECV", rank=d, stream=1,
                    attrs={"comm_src": (d - s) % DIES, "comm_size": tokens_per_dest * DISPATCH_BYTES_PER_TOKEN,
                           "comm_tag": 2 * mb})
            received = tokens_per_dest * len(STRIDES)
            add(name=f"expert_mlp_mb{mb}", type="COMP", rank=d, stream=1,
                attrs={"num_ops": 2 * received * HIDDEN * EXPERT_FFN * 3, "tensor_size": HIDDEN * EXPERT_FFN * 3,
                       "cmemu.unit": "aic", "cmemu.dtype": "int8", "cmemu.cores": 8})
            for s in STRIDES:
                add(name=f"combine_send_mb{mb}_to{(d - s) % DIES}", type="COMM_SEND", rank=d, stream=1,
                    attrs={"comm_dst": (d - s) % DIES, "comm_size": tokens_per_dest * COMBINE_BYTES_PER_TOKEN,
                           "comm_tag": 2 * mb + 1})
            for s in STRIDES:
                add(name=f"combine_recv_mb{mb}_from{(d + s) % DIES}", type="COMM_RECV", rank=d, stream=1,
                    attrs={"comm_src": (d + s) % DIES, "comm_size": tokens_per_dest * COMBINE_BYTES_PER_TOKEN,
                           "comm_tag": 2 * mb + 1})
            add(name=f"combine_sum_mb{mb}", type="COMP", rank=d, stream=1,
                attrs={"num_ops": 2 * TOKENS * TOP_K * HIDDEN, "cmemu.unit": "aiv", "cmemu.dtype": "bf16",
                       "cmemu.cores": 16})
    doc = {
        "schema": "cmemu.trace",
        "version": 1,
        "time_unit": "ns",
        "system": "mini",
        "description": "one MoE decode layer, 2 micro-batches on 2 streams, 32 dies (traces/gen_mini_moe_layer.py)",
        "nodes": nodes,
    }
    print(json.dumps(doc, indent=None, separators=(",", ":")).replace('{"id"', '\n{"id"'))


if __name__ == "__main__":
    main()
