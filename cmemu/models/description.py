"""A model as the step generator sees it, read from a Hugging Face-style ``config.json``.

``ModelDescription`` holds what changes the work of a decode or prefill step, each field with its
unit or meaning in its name; ``read_config`` builds one from a config file and refuses, naming
the file and the field, anything it does not know or that contradicts itself. The configs of a
few published models ship with cmemu (``cmemu/models/configs``, listed in its ``index.toml``
with their sources); ``load_model`` takes one of their names or a path to any other config.

Which config fields are read (``READ``) and which are known not to change the work of a step in
this model (``IGNORED``: token ids, RoPE frequencies, norm epsilons, training losses, the
checkpoint's own dtype, which the deployment replaces) is listed below; any other field is an
error, so that a new architecture's field is never silently dropped.
"""
from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from cmemu.errors import CmemuError

CONFIG_DIR = Path(__file__).with_name("configs")

# Fields that do not change the work of a step (see the module docstring).
IGNORED = frozenset({
    "architectures", "auto_map", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
    "rms_norm_eps", "rope_theta", "rope_scaling", "max_position_embeddings", "attention_dropout",
    "aux_loss_alpha", "seq_aux", "router_aux_loss_coef", "output_router_logits", "use_cache", "torch_dtype",
    "dtype", "transformers_version", "quantization_config", "routed_scaling_factor", "norm_topk_prob", "ep_size",
    "_name_or_path", "max_window_layers", "partial_rotary_factor",
})
# Fields read (some only checked to hold the value the model assumes).
READ = frozenset({
    "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "n_routed_experts",
    "num_experts", "num_local_experts", "n_shared_experts", "num_experts_per_tok", "first_k_dense_replace",
    "moe_layer_freq", "mlp_only_layers", "decoder_sparse_step", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "scoring_func", "n_group", "topk_group", "topk_method", "vocab_size",
    "tie_word_embeddings", "num_nextn_predict_layers", "attention_bias", "mlp_bias", "hidden_act", "pretraining_tp",
    "sliding_window", "use_sliding_window", "use_qk_norm",
})
# Model types whose attention normalises q and k per head (RMSNorm of head_dim values) without a
# config field saying so (Qwen3's q_norm / k_norm).
QK_NORM_TYPES = frozenset({"qwen3", "qwen3_moe"})


@dataclass(frozen=True)
class ModelDescription:
    """What a step generator needs of a model. Sizes are counts of values (one per element of a
    vector), not bytes: the deployment's dtypes give the bytes."""

    name: str
    source: str  # where the description came from (a config file, and its published origin)
    hidden_values: int  # values per token between layers (hidden_size)
    layers: int  # decoder layers (num_hidden_layers), MTP layers not included
    dense_first_layers: int  # leading layers with a dense FFN instead of experts (all: a dense model)
    attention: str  # "mla" (latent KV, DeepSeek-V3) or "gqa" (grouped-query; MHA when kv_heads == query_heads)
    query_heads: int
    kv_heads: int  # GQA: K/V heads; MLA: the query heads (every head reads the one latent)
    head_values: int  # GQA: values per head of q, k and v (head_dim); MLA: 0
    q_lora_values: int  # MLA: rank of the query compression (0: none)
    kv_lora_values: int  # MLA: latent values per position in the KV cache
    qk_nope_values: int  # MLA: per-head q/k values without rotary embedding
    qk_rope_values: int  # MLA: per-head q/k values with rotary embedding (k's shared by all heads)
    v_head_values: int  # MLA: per-head v values
    qk_norm: bool  # GQA: an RMSNorm over each q and k head (Qwen3)
    attention_bias: bool  # GQA: biases on the q, k, v projections
    routed_experts: int  # 0: a dense model
    shared_experts: int  # experts every token goes through
    experts_per_token: int  # routed experts each token picks (top-k)
    expert_ffn_values: int  # intermediate values of one routed expert (moe_intermediate_size)
    shared_ffn_values: int  # intermediate values of all shared experts together
    dense_ffn_values: int  # intermediate values of a dense layer's FFN (intermediate_size)
    router_scoring: str  # "softmax" or "sigmoid" (DeepSeek-V3's, with a bias per expert)
    router_bias: bool  # a learnt bias per routed expert added before the top-k (noaux_tc)
    router_groups: int  # expert groups the router picks among first (n_group; 1: no grouping)
    router_groups_per_token: int  # groups a token's experts come from (topk_group)
    vocab_tokens: int
    tied_embeddings: bool  # the LM head is the embedding matrix
    mtp_layers: int  # multi-token-prediction modules (num_nextn_predict_layers)

    @property
    def moe(self) -> bool:
        return self.routed_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_first_layers

    # --- parameter counts (weights, norms and biases; no buffers) ---------------------------

    def attention_params(self) -> int:
        h, H = self.hidden_values, self.query_heads
        if self.attention == "mla":
            qk = self.qk_nope_values + self.qk_rope_values
            q = (h * self.q_lora_values + self.q_lora_values + self.q_lora_values * H * qk if self.q_lora_values
                 else h * H * qk)
            kv = h * (self.kv_lora_values + self.qk_rope_values) + self.kv_lora_values
            kv += self.kv_lora_values * H * (self.qk_nope_values + self.v_head_values)
            return q + kv + H * self.v_head_values * h
        d, kv = self.head_values, self.kv_heads
        n = h * (H + 2 * kv) * d + H * d * h
        if self.attention_bias:
            n += (H + 2 * kv) * d
        if self.qk_norm:
            n += 2 * d
        return n

    def ffn_params(self, dense: bool) -> int:
        """One layer's FFN (or MoE: router, routed and shared experts), SwiGLU: 3 matrices each."""
        h = self.hidden_values
        if dense:
            return 3 * h * self.dense_ffn_values
        router = h * self.routed_experts + (self.routed_experts if self.router_bias else 0)
        return router + 3 * h * (self.routed_experts * self.expert_ffn_values + self.shared_ffn_values)

    def layer_params(self, dense: bool) -> int:
        return 2 * self.hidden_values + self.attention_params() + self.ffn_params(dense)

    def embedding_params(self) -> int:
        """The embedding and, unless tied, the LM head."""
        return self.vocab_tokens * self.hidden_values * (1 if self.tied_embeddings else 2)

    def mtp_params(self) -> int:
        """One DeepSeek-V3 MTP module per MTP layer: two RMSNorms, the 2h -> h projection, one
        decoder layer (MoE if the model has experts) and its head's RMSNorm; it shares the
        model's embedding and LM head (not counted again)."""
        h = self.hidden_values
        return self.mtp_layers * (3 * h + 2 * h * h + self.layer_params(dense=not self.moe))

    def params(self) -> int:
        """Total parameters of the model, the MTP modules not counted."""
        return (self.dense_first_layers * self.layer_params(True) + self.moe_layers * self.layer_params(False)
                + self.hidden_values + self.embedding_params())

    def activated_params(self) -> int:
        """Parameters a token goes through (its top-k routed experts and the shared ones), the
        embedding and LM head included, the MTP modules not."""
        moe = self.layer_params(False) - 3 * self.hidden_values * (self.routed_experts - self.experts_per_token) \
            * self.expert_ffn_values if self.moe else 0
        return (self.dense_first_layers * self.layer_params(True) + self.moe_layers * moe + self.hidden_values
                + self.embedding_params())

    def summary(self) -> dict:
        """The description and its parameter counts, for `cmemu models --json`."""
        return {**asdict(self), "params": self.params(), "activated_params": self.activated_params(),
                "mtp_params": self.mtp_params(), "embedding_params": self.embedding_params()}


def _fail(path, field, message) -> None:
    raise CmemuError(f"{path}: field '{field}': {message}")


def read_config(path, name: str | None = None, source: str | None = None) -> ModelDescription:
    """The description of the model whose Hugging Face ``config.json`` is at ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CmemuError(f"{path}: cannot read the model config: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CmemuError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(doc, dict):
        raise CmemuError(f"{path}: a model config is a JSON object, got {type(doc).__name__}")
    if isinstance(doc.get("text_config"), dict):  # multimodal wrappers hold the language model here
        doc = doc["text_config"]
    return describe(doc, path, name or path.parent.name if path.name == "config.json" else name or path.stem,
                    source or str(path))


def describe(doc: dict, path, name: str, source: str) -> ModelDescription:
    """``read_config`` of an already parsed config (``path`` names it in errors)."""
    for key in doc:
        if key not in READ and key not in IGNORED:
            _fail(path, key, "unknown to cmemu's model description (docs/model.md lists the fields it reads and "
                             "those it ignores); remove it if it does not change the model's work")

    def get(key, kind=int, default=None, minimum=None):
        if key not in doc or doc[key] is None:
            if default is None:
                _fail(path, key, "missing (needed for this model)")
            return default
        v = doc[key]
        if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
            _fail(path, key, f"must be an integer, got {v!r}")
        if kind is bool and not isinstance(v, bool):
            _fail(path, key, f"must be true or false, got {v!r}")
        if kind is str and not isinstance(v, str):
            _fail(path, key, f"must be a string, got {v!r}")
        if minimum is not None and v < minimum:
            _fail(path, key, f"must be at least {minimum}, got {v}")
        return v

    mtype = get("model_type", str)
    hidden = get("hidden_size", minimum=1)
    layers = get("num_hidden_layers", minimum=1)
    heads = get("num_attention_heads", minimum=1)
    vocab = get("vocab_size", minimum=1)
    if get("hidden_act", str, "silu") != "silu":
        _fail(path, "hidden_act", f"only silu (SwiGLU FFNs) is modelled, got {doc['hidden_act']!r}")
    if get("mlp_bias", bool, False):
        _fail(path, "mlp_bias", "FFN biases are not modelled")
    if get("pretraining_tp", int, 1) != 1:
        _fail(path, "pretraining_tp", "only 1 is modelled (it changes how the checkpoint splits its matmuls)")
    if get("use_sliding_window", bool, False):
        _fail(path, "use_sliding_window", "sliding-window attention is not modelled")
    if "sliding_window" in doc and doc["sliding_window"] is not None and "use_sliding_window" not in doc:
        _fail(path, "sliding_window", "sliding-window attention is not modelled")

    # Attention.
    mla = "kv_lora_rank" in doc and doc["kv_lora_rank"] is not None
    kv_heads = get("num_key_value_heads", int, heads, minimum=1)
    if mla:
        q_lora = get("q_lora_rank", int, 0, minimum=0)
        kv_lora = get("kv_lora_rank", minimum=1)
        nope, rope, v_head = get("qk_nope_head_dim", minimum=1), get("qk_rope_head_dim", minimum=1), \
            get("v_head_dim", minimum=1)
        if kv_heads != heads:
            _fail(path, "num_key_value_heads", f"MLA has one latent for all heads: must equal num_attention_heads "
                                               f"({heads}), got {kv_heads}")
        head_values, qk_norm, bias = 0, False, False
        if doc.get("use_qk_norm"):
            _fail(path, "use_qk_norm", "per-head q/k norms are not part of MLA attention")
    else:
        for key in ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if doc.get(key) is not None:
                _fail(path, key, "an MLA field, but the config has no kv_lora_rank (not MLA)")
        q_lora = kv_lora = nope = rope = v_head = 0
        head_values = get("head_dim", int, hidden // heads, minimum=1)
        if "head_dim" not in doc and hidden % heads:
            _fail(path, "num_attention_heads", f"hidden_size {hidden} is not a multiple of it ({heads}): give head_dim")
        if heads % kv_heads:
            _fail(path, "num_key_value_heads", f"must divide num_attention_heads ({heads}), got {kv_heads}")
        qk_norm = get("use_qk_norm", bool, mtype in QK_NORM_TYPES)
        bias = get("attention_bias", bool, False)

    # FFN and experts.
    expert_keys = [k for k in ("n_routed_experts", "num_experts", "num_local_experts") if doc.get(k) is not None]
    if len(expert_keys) > 1:
        _fail(path, expert_keys[1], f"the routed experts are given twice ({' and '.join(expert_keys)})")
    routed = get(expert_keys[0], minimum=0) if expert_keys else 0
    dense_ffn = get("intermediate_size", int, 0, minimum=0)
    if routed:
        top_k = get("num_experts_per_tok", minimum=1)
        if top_k > routed:
            _fail(path, "num_experts_per_tok", f"{top_k} is more than the {routed} routed experts")
        expert_ffn = get("moe_intermediate_size", int, 0 if mtype == "mixtral" else None, minimum=0) or dense_ffn
        if not expert_ffn:
            _fail(path, "moe_intermediate_size", "missing (needed for this model)")
        shared = get("n_shared_experts", int, 0, minimum=0)
        shared_ffn = get("shared_expert_intermediate_size", int, shared * expert_ffn, minimum=0)
        if shared_ffn and not shared:
            shared = 1  # Qwen2-MoE: one shared expert of shared_expert_intermediate_size
        if get("moe_layer_freq", int, 1) != 1:
            _fail(path, "moe_layer_freq", "only 1 (every layer after the dense ones is MoE) is modelled")
        if get("decoder_sparse_step", int, 1) != 1:
            _fail(path, "decoder_sparse_step", "only 1 (every layer after the dense ones is MoE) is modelled")
        dense_first = get("first_k_dense_replace", int, 0, minimum=0)
        only = doc.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            _fail(path, "mlp_only_layers", f"must be a list of layer numbers, got {only!r}")
        if only:
            if sorted(only) != list(range(len(only))):
                _fail(path, "mlp_only_layers", f"only dense layers that come first are modelled, got {only}")
            if dense_first and dense_first != len(only):
                _fail(path, "mlp_only_layers", f"disagrees with first_k_dense_replace ({dense_first})")
            dense_first = len(only)
        if dense_first >= layers:
            _fail(path, "first_k_dense_replace", f"{dense_first} dense layers leave no MoE layer of {layers}")
        if dense_first and not dense_ffn:
            _fail(path, "intermediate_size", "missing: the dense layers need it")
        scoring = get("scoring_func", str, "softmax")
        if scoring not in ("softmax", "sigmoid"):
            _fail(path, "scoring_func", f"must be softmax or sigmoid, got {scoring!r}")
        groups = get("n_group", int, 1, minimum=1)
        per_token = get("topk_group", int, groups, minimum=1)
        if routed % groups:
            _fail(path, "n_group", f"must divide the {routed} routed experts, got {groups}")
        if per_token > groups:
            _fail(path, "topk_group", f"{per_token} is more than the {groups} groups (n_group)")
        method = get("topk_method", str, "greedy")
        if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
            _fail(path, "topk_method", f"must be greedy, group_limited_greedy or noaux_tc, got {method!r}")
        router_bias = method == "noaux_tc"
    else:
        for key in ("num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace"):
            if doc.get(key):
                _fail(path, key, "an MoE field, but the config has no routed experts")
        if not dense_ffn:
            _fail(path, "intermediate_size", "missing (needed for this model)")
        top_k = expert_ffn = shared = shared_ffn = 0
        dense_first, scoring, groups, per_token, router_bias = layers, "none", 1, 1, False
    mtp = get("num_nextn_predict_layers", int, 0, minimum=0)
    return ModelDescription(
        name=name, source=source, hidden_values=hidden, layers=layers, dense_first_layers=dense_first,
        attention="mla" if mla else "gqa", query_heads=heads, kv_heads=kv_heads, head_values=head_values,
        q_lora_values=q_lora, kv_lora_values=kv_lora, qk_nope_values=nope, qk_rope_values=rope, v_head_values=v_head,
        qk_norm=qk_norm, attention_bias=bias, routed_experts=routed, shared_experts=shared, experts_per_token=top_k,
        expert_ffn_values=expert_ffn, shared_ffn_values=shared_ffn, dense_ffn_values=dense_ffn,
        router_scoring=scoring, router_bias=router_bias, router_groups=groups, router_groups_per_token=per_token,
        vocab_tokens=vocab, tied_embeddings=get("tie_word_embeddings", bool, False), mtp_layers=mtp)


# --- shipped models -----------------------------------------------------------------------------


def shipped_models() -> dict[str, dict]:
    """name -> its entry in configs/index.toml (title, config file, sources, card figures)."""
    return tomllib.loads((CONFIG_DIR / "index.toml").read_text(encoding="utf-8"))


def load_model(name_or_path) -> ModelDescription:
    """A shipped model by name (``cmemu models``), or the config.json at a path."""
    text = str(name_or_path)
    shipped = shipped_models()
    if text in shipped:
        entry = shipped[text]
        return read_config(CONFIG_DIR / entry["config"], name=text, source=entry["config_source"])
    if text.endswith(".json") or Path(text).is_file():
        return read_config(Path(text))
    raise CmemuError(f"unknown model {text!r}: give a shipped model ({', '.join(sorted(shipped))}) or the path of "
                     "a Hugging Face config.json")


def parse_count(text: str) -> tuple[float, float]:
    """A card's rounded parameter count ("671B", "30.5B", "1T") as (value, half a unit of its
    last digit): the rounding it was published with."""
    scale = {"M": 1e6, "B": 1e9, "T": 1e12}[text[-1]]
    digits = text[:-1]
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits) * scale, 0.5 * 10 ** -decimals * scale


def format_count(n: float) -> str:
    """A parameter count in billions with 3 significant figures (e.g. 671B, 30.5B, 1.03T)."""
    if n >= 1e12:
        return f"{n / 1e12:.3g}T"
    if n >= 1e9:
        return f"{n / 1e9:.{max(0, 2 - int(math.log10(n / 1e9)))}f}B"
    return f"{n / 1e6:.3g}M"
