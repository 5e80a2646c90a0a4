"""Independent PyTorch reference of MiniCPM-SALA (spec: shared/spec/minicpm-sala.md).

Written from the spec, for clarity, not speed. Plain torch (runs on torch 1.13 and 2.x, CPU).

Numerics: everything is computed in float64 with no bf16 rounding points (the spec's bf16
rounding of the reference is deliberately not modelled; the C++ CPU engine computes in f32
without rounding, and goldens compare at relative error < 1e-4). The only deliberately
fp32 quantities are the ones the spec defines in fp32 as *parameters*:
  * RoPE inv_freq (exponent, pow, reciprocal in fp32) and the angle p * inv_freq (one fp32
    multiply), then cos/sin in float64 of that fp32 angle (spec §3.3);
  * the lightning slopes (computed in double, stored as fp32, negated: spec §3.5); the decay
    exponentials are then computed in float64 from the fp32 log-decay.
Weights (BF16/F16/F32 in the checkpoint) are converted to float64 at load.

Main entry points:
  Model(path)                      load config.json + safetensors (sharded or not)
  state = model.new_state()        per-sequence cache (copy.deepcopy(state) to fork it)
  model.forward(state, tokens, regime_len=None)  -> logits [Lq, V] (float64), updates state
  model.forward_full(tokens, regime_len=None)    -> logits [T, V], one-shot, second
                                                    implementation (chunked GLA, vectorised
                                                    InfLLM-v2) used as a cross-check
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402

DT = torch.float64
NEG_INF = float("-inf")
POS_INF = float("inf")

LIGHTNING_ALIASES = ("lightning", "lightning_attn", "lightning-attn")
SPARSE_KIND = "minicpm4"

# ---------------------------------------------------------------------------------------------
# Configuration (spec §1.1)
# ---------------------------------------------------------------------------------------------

SPARSE_DEFAULTS = {"kernel_size": 32, "kernel_stride": 16, "init_blocks": 1, "block_size": 64,
                   "window_size": 2048, "topk": 64, "use_nope": False, "dense_len": 8192}


class Config(object):
    """Parsed config.json with the defaults of spec §1.1."""

    def __init__(self, d):
        g = d.get
        self.raw = dict(d)
        self.vocab_size = int(g("vocab_size", 73448))
        self.hidden_size = int(g("hidden_size", 4096))
        self.intermediate_size = int(g("intermediate_size", 16384))
        self.num_layers = int(g("num_hidden_layers", 32))
        self.num_heads = int(g("num_attention_heads", 32))
        nkv = g("num_key_value_heads")
        self.num_kv_heads = int(self.num_heads if nkv is None else nkv)
        self.rms_norm_eps = float(g("rms_norm_eps", 1e-6))
        self.rope_theta = float(g("rope_theta", 10000.0))
        self.scale_emb = float(g("scale_emb", 12))
        self.dim_model_base = float(g("dim_model_base", 256))
        self.scale_depth = float(g("scale_depth", 1.4))
        if "head_dim" not in d:
            self.head_dim = 128
        elif d["head_dim"] is None:
            self.head_dim = self.hidden_size // self.num_heads
        else:
            self.head_dim = int(d["head_dim"])
        self.lightning_head_dim = int(_default(d, "lightning_head_dim", self.head_dim))
        self.lightning_nh = int(_default(d, "lightning_nh", self.num_heads))
        self.lightning_nkv = int(_default(d, "lightning_nkv", self.num_kv_heads))
        self.use_output_gate = bool(g("use_output_gate", True))
        self.use_output_norm = bool(g("use_output_norm", True))
        self.attn_use_output_gate = bool(g("attn_use_output_gate", True))
        self.lightning_use_rope = bool(g("lightning_use_rope", True))
        self.qk_norm = bool(g("qk_norm", True))
        self.attn_use_rope = bool(g("attn_use_rope", False))
        self.lightning_scale = _default(d, "lightning_scale", "1/sqrt(d)")
        self.tie_word_embeddings = bool(g("tie_word_embeddings", False))
        eos = _default(d, "eos_token_id", [2, 73440])
        self.eos_token_ids = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        self.bos_token_id = g("bos_token_id", 1)

        sc = dict(SPARSE_DEFAULTS)
        for k, v in (g("sparse_config") or {}).items():
            if v is not None:
                sc[k] = v
        self.kernel_size = int(sc["kernel_size"])
        self.kernel_stride = int(sc["kernel_stride"])
        self.init_blocks = int(sc["init_blocks"])
        self.block_size = int(sc["block_size"])
        self.window_size = int(sc["window_size"])
        self.topk = int(sc["topk"])
        self.dense_len = int(sc["dense_len"])

        mt = g("mixer_types")
        if mt is None:
            raise ValueError("config: mixer_types is mandatory")
        if len(mt) != self.num_layers:
            raise ValueError("config: mixer_types has %d entries, num_hidden_layers is %d"
                             % (len(mt), self.num_layers))
        self.mixers = []
        for i, m in enumerate(mt):
            if m in LIGHTNING_ALIASES:
                self.mixers.append("L")
            elif m == SPARSE_KIND:
                self.mixers.append("S")
            else:
                raise ValueError("config: mixer_types[%d] = %r is not a known mixer" % (i, m))
        self.validate()

    def validate(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        # The reference builds lightning layers with num_attention_heads / head_dim; ports use
        # the lightning_* fields. They must agree (spec §1.1).
        if "L" in self.mixers:
            if self.lightning_nh != self.num_heads or self.lightning_head_dim != self.head_dim:
                raise ValueError("lightning_nh/lightning_head_dim (%d/%d) differ from "
                                 "num_attention_heads/head_dim (%d/%d)"
                                 % (self.lightning_nh, self.lightning_head_dim,
                                    self.num_heads, self.head_dim))
            if self.lightning_nh % self.lightning_nkv:
                raise ValueError("lightning_nh must be a multiple of lightning_nkv")
        if (self.lightning_use_rope or self.attn_use_rope) and self.head_dim % 2:
            raise ValueError("RoPE needs an even head_dim")
        for name in ("kernel_size", "kernel_stride", "block_size", "window_size"):
            if getattr(self, name) <= 0:
                raise ValueError("sparse_config.%s must be positive" % name)

    # Derived values -----------------------------------------------------------------------
    @property
    def residual_scale(self):
        return self.scale_depth / math.sqrt(self.num_layers)

    @property
    def logit_divisor(self):
        return self.hidden_size / self.dim_model_base

    @property
    def lightning_qk_scale(self):
        d = self.lightning_head_dim
        if self.lightning_scale == "1/sqrt(d)":
            return d ** -0.5
        if self.lightning_scale == "1/d":
            return 1.0 / d
        return 1.0

    @property
    def local_blocks(self):  # W
        return self.window_size // self.block_size

    def n1(self, T):
        return n_chunks(T, self.kernel_size, self.kernel_stride)

    def n2(self, T):
        return n_chunks(T, 4 * self.kernel_size, 4 * self.kernel_stride)

    def num_blocks(self, T):  # NB
        return -(-T // self.block_size)

    def budget(self, T):  # top-k K
        return min(self.topk + self.local_blocks, self.num_blocks(T))


def _default(d, key, value):
    v = d.get(key)
    return value if v is None else v


def n_chunks(T, ks, st):
    """Number of complete compression windows of size ks, stride st over T tokens (§4.4)."""
    return 0 if T < ks else (T - ks) // st + 1


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------

def rms_norm(x, w, eps):
    """RMSNorm over the last dim (§2.1), float64, no rounding."""
    ms = (x * x).mean(dim=-1, keepdim=True)
    return x * torch.rsqrt(ms + eps) * w


def silu(x):
    return x * torch.sigmoid(x)


def alibi_slopes(n):
    """ALiBi slope recipe (§3.5), in double, including the non-power-of-two interleave rule."""
    def pow2(m):
        start = 2.0 ** (-(2.0 ** -(math.log2(m) - 3)))
        return [start * start ** i for i in range(m)]     # start * ratio**i, ratio = start
    if math.log2(n).is_integer():
        return pow2(n)
    m = 2 ** int(math.floor(math.log2(n)))
    return pow2(m) + alibi_slopes(2 * m)[0::2][: n - m]


def lightning_log_decay(n):
    """g[h] = -slope[h]; slopes computed in double, stored as fp32, then negated (§3.5)."""
    s = np.array(alibi_slopes(n), dtype=np.float64).astype(np.float32)
    return -torch.tensor(s.astype(np.float64), dtype=DT)


def rope_inv_freq(d, theta):
    """inv_freq[i] = 1 / theta^((2i)/d), i < d/2, each step in fp32 (§3.3).

    The fp32 pow is taken as the correctly rounded fp32 value of the exact power."""
    i2 = torch.arange(0, d, 2, dtype=torch.float32)
    expo = i2 / torch.tensor(float(d), dtype=torch.float32)            # fp32 division
    pw = torch.pow(torch.tensor(theta, dtype=DT), expo.to(DT)).to(torch.float32)  # fp32 pow
    return torch.tensor(1.0, dtype=torch.float32) / pw                  # fp32 reciprocal


def rope_cos_sin(positions, d, theta):
    """cos/sin [L, d/2] (float64) of the fp32 angle fp32(p) * inv_freq (one fp32 multiply)."""
    inv = rope_inv_freq(d, theta)
    p = torch.as_tensor(positions, dtype=torch.float32).reshape(-1, 1)
    ang = (p * inv.reshape(1, -1)).to(DT)
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE on x [L, heads, d] with pairs (i, i + d/2) (§3.3)."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def gla_recurrent(q, k, v, g, scale, S0):
    """Simple-GLA plain recurrence (§3.6).

    q, k, v: [L, H, d] ; g: [H] log-decay ; S0: [H, d_k, d_v]. Returns (o [L, H, d_v], S)."""
    gamma = torch.exp(g)[:, None, None]
    S = S0.clone()
    out = []
    for t in range(q.shape[0]):
        S = gamma * S + k[t][:, :, None] * v[t][:, None, :]        # S <- γS + k⊗v
        out.append(scale * (q[t][:, :, None] * S).sum(dim=1))     # o[b] = s Σ_a q[a] S[a][b]
    o = torch.stack(out, 0) if out else q.new_zeros((0,) + tuple(v.shape[1:]))
    return o, S


def gla_chunked(q, k, v, g, scale, S0, chunk=64):
    """Chunked-parallel Simple-GLA (§3.7), second implementation of the same recurrence."""
    L, H, _ = q.shape
    S = S0.clone()
    outs = []
    for c0 in range(0, L, chunk):
        qc, kc, vc = q[c0:c0 + chunk], k[c0:c0 + chunk], v[c0:c0 + chunk]
        C = qc.shape[0]
        beta = torch.arange(1, C + 1, dtype=DT)[:, None] * g[None, :]      # [C, H], β_i=(i+1)g
        inter = scale * torch.exp(beta)[:, :, None] * torch.einsum("iha,hab->ihb", qc, S)
        qk = torch.einsum("iha,jha->hij", qc, kc)                          # [H, C, C]
        decay = torch.exp(beta.t()[:, :, None] - beta.t()[:, None, :])     # exp(β_i - β_j)
        causal = torch.tril(torch.ones(C, C, dtype=torch.bool))
        w = torch.where(causal[None], qk * decay, torch.zeros((), dtype=DT))
        intra = scale * torch.einsum("hij,jhb->ihb", w, vc)
        outs.append(inter + intra)
        last = beta[C - 1]                                                 # β_{C'-1}, [H]
        kdec = kc * torch.exp(last[None, :] - beta)[:, :, None]            # exp(β_{C'-1}-β_j) k_j
        S = torch.exp(last)[:, None, None] * S + torch.einsum("jha,jhb->hab", kdec, vc)
    o = torch.cat(outs, 0) if outs else q.new_zeros((0,) + tuple(v.shape[1:]))
    return o, S


def compress_keys(K, ks, st):
    """Means of complete windows [c*st, c*st+ks) of K [T, Hs, d] -> [n, Hs, d] (§4.4)."""
    n = n_chunks(K.shape[0], ks, st)
    if n == 0:
        return K.new_zeros((0,) + tuple(K.shape[1:]))
    return torch.stack([K[c * st: c * st + ks].mean(dim=0) for c in range(n)], 0)


def pool_range(k, cfg):
    """K1 chunk indices c with c*st < (k+1)*bs and c*st + ks > k*bs (unclipped at the top)."""
    st, ks, bs = cfg.kernel_stride, cfg.kernel_size, cfg.block_size
    lo = max(0, (k * bs - ks) // st + 1)
    hi = ((k + 1) * bs - 1) // st
    return lo, hi


def is_forced(k, qb, cfg):
    return k < cfg.init_blocks or (qb - cfg.local_blocks <= k <= qb)


# ---- per-token InfLLM-v2 (used by the incremental path) -------------------------------------

def stage1_scores(qg, K1, K2, p, cfg, scale):
    """Stage-1 group score for one KV head and one query at position p (§4.5).

    qg: [G, d] the group's query heads; K1: [n1_cols, d]; K2: [n2_cols, d].
    Returns score [n1_cols]: sum over the G heads of exp(s q.K1 - logsumexp_visible(s q.K2))
    for visible K1 columns, 0 for invisible ones, +inf for visible ones when no K2 is visible."""
    n1_cols = K1.shape[0]
    score = torch.zeros(n1_cols, dtype=DT)
    v1 = cfg.n1(p + 1)   # visible K1 chunks: c*st + ks - 1 <= p  (a prefix)
    v2 = cfg.n2(p + 1)   # visible K2 chunks
    if v1 == 0:
        return score
    if v2 == 0:
        score[:v1] = POS_INF
        return score
    b = scale * (qg @ K1[:v1].t())                        # [G, v1]
    a = scale * (qg @ K2[:v2].t())                        # [G, v2]
    lam = torch.logsumexp(a, dim=-1, keepdim=True)        # [G, 1]
    score[:v1] = torch.exp(b - lam).sum(dim=0)
    return score


def pool_blocks(score, qb, NB, cfg):
    """Block scores B[k], k < NB (§4.6): +inf if forced, max over the pooled chunks, -inf if
    no chunk of the window exists."""
    n1_cols = score.shape[0]
    B = []
    for k in range(NB):
        if is_forced(k, qb, cfg):
            B.append(POS_INF)
            continue
        lo, hi = pool_range(k, cfg)
        hi = min(hi, n1_cols - 1)
        B.append(float(score[lo:hi + 1].max()) if lo <= hi else NEG_INF)
    return B


def select_blocks(B, qb, K, cfg):
    """Deterministic top-k (§4.7): past blocks k <= qb sorted by (forced first, score desc,
    index asc), the first K are taken. Future blocks are never selected.

    "Forced first" only matters when a non-forced block also scores +inf, i.e. when no K2 chunk
    is visible yet (§4.5 edge case) and the geometry leaves non-forced past blocks at such
    positions (never for the released config); it keeps the local window selected."""
    order = sorted(range(min(qb + 1, len(B))),
                   key=lambda k: (not is_forced(k, qb, cfg), -B[k], k))
    return sorted(order[:K])


# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------

class State(object):
    """Per-sequence cache. Sparse layer i: K[i], V[i] [T, Hs, d], compressed K1[i], K2[i]
    (maintained incrementally, §4.4); lightning layer i: S[i] [H, d, d]. copy.deepcopy works."""

    def __init__(self, cfg):
        self.length = 0
        self.K, self.V, self.K1, self.K2, self.S = {}, {}, {}, {}, {}
        for i, m in enumerate(cfg.mixers):
            if m == "S":
                d, hs = cfg.head_dim, cfg.num_kv_heads
                for store in (self.K, self.V, self.K1, self.K2):
                    store[i] = torch.zeros(0, hs, d, dtype=DT)
            else:
                d = cfg.lightning_head_dim
                self.S[i] = torch.zeros(cfg.lightning_nh, d, d, dtype=DT)


class Model(object):
    def __init__(self, path=None, config=None, tensors=None):
        """Model(path) loads PATH/config.json and PATH's safetensors; or Model(config=dict,
        tensors=dict of numpy/torch arrays)."""
        if path is not None:
            with open(os.path.join(path, "config.json")) as f:
                config = json.load(f)
            tensors = safetensors_np.load_checkpoint(path)
        self.cfg = Config(config)
        self.w = {}
        for name, arr in tensors.items():
            if "rotary_emb" in name or "compress" in name:
                continue
            self.w[name] = torch.as_tensor(np.asarray(arr, dtype=np.float64)).to(DT)
        self._check_weights()
        self.g = lightning_log_decay(self.cfg.lightning_nh)   # per lightning query head

    # ---- weights ------------------------------------------------------------------------
    def _expect(self, name, shape):
        if name not in self.w:
            raise KeyError("checkpoint is missing tensor %s" % name)
        if tuple(self.w[name].shape) != tuple(shape):
            raise ValueError("tensor %s has shape %s, expected %s"
                             % (name, tuple(self.w[name].shape), tuple(shape)))

    def _check_weights(self):
        c = self.cfg
        D, I, V = c.hidden_size, c.intermediate_size, c.vocab_size
        self._expect("model.embed_tokens.weight", (V, D))
        self._expect("model.norm.weight", (D,))
        if c.tie_word_embeddings and "lm_head.weight" not in self.w:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self._expect("lm_head.weight", (V, D))
        for i, m in enumerate(c.mixers):
            p = "model.layers.%d." % i
            self._expect(p + "input_layernorm.weight", (D,))
            self._expect(p + "post_attention_layernorm.weight", (D,))
            self._expect(p + "mlp.gate_proj.weight", (I, D))
            self._expect(p + "mlp.up_proj.weight", (I, D))
            self._expect(p + "mlp.down_proj.weight", (D, I))
            a = p + "self_attn."
            if m == "S":
                H, Hs, d = c.num_heads, c.num_kv_heads, c.head_dim
                self._expect(a + "q_proj.weight", (H * d, D))
                self._expect(a + "k_proj.weight", (Hs * d, D))
                self._expect(a + "v_proj.weight", (Hs * d, D))
                self._expect(a + "o_proj.weight", (D, H * d))
                if c.attn_use_output_gate:
                    self._expect(a + "o_gate.weight", (H * d, D))
            else:
                H, Hk, d = c.lightning_nh, c.lightning_nkv, c.lightning_head_dim
                self._expect(a + "q_proj.weight", (H * d, D))
                self._expect(a + "k_proj.weight", (Hk * d, D))
                self._expect(a + "v_proj.weight", (Hk * d, D))
                self._expect(a + "o_proj.weight", (D, H * d))
                if c.use_output_gate:
                    self._expect(a + "z_proj.weight", (H * d, D))
                if c.qk_norm:
                    self._expect(a + "q_norm.weight", (d,))
                    self._expect(a + "k_norm.weight", (d,))
                if c.use_output_norm:
                    self._expect(a + "o_norm.weight", (H * d,))

    def W(self, name):
        return self.w[name]

    def new_state(self):
        return State(self.cfg)

    # ---- shared pieces -----------------------------------------------------------------
    def _embed(self, tokens):
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        return self.W("model.embed_tokens.weight")[ids] * self.cfg.scale_emb

    def _mlp(self, i, x):
        p = "model.layers.%d.mlp." % i
        g = x @ self.W(p + "gate_proj.weight").t()
        u = x @ self.W(p + "up_proj.weight").t()
        return (silu(g) * u) @ self.W(p + "down_proj.weight").t()

    def _logits(self, h):
        c = self.cfg
        y = rms_norm(h, self.W("model.norm.weight"), c.rms_norm_eps)
        return (y / c.logit_divisor) @ self.W("lm_head.weight").t()

    def _lightning_qkvz(self, i, x, positions):
        """Projections, per-head q/k RMSNorm, RoPE, GQA repeat (§3.1-3.4)."""
        c = self.cfg
        a = "model.layers.%d.self_attn." % i
        L = x.shape[0]
        H, Hk, d = c.lightning_nh, c.lightning_nkv, c.lightning_head_dim
        q = (x @ self.W(a + "q_proj.weight").t()).reshape(L, H, d)
        k = (x @ self.W(a + "k_proj.weight").t()).reshape(L, Hk, d)
        v = (x @ self.W(a + "v_proj.weight").t()).reshape(L, Hk, d)
        z = x @ self.W(a + "z_proj.weight").t() if c.use_output_gate else None
        if c.qk_norm:
            q = rms_norm(q, self.W(a + "q_norm.weight"), c.rms_norm_eps)
            k = rms_norm(k, self.W(a + "k_norm.weight"), c.rms_norm_eps)
        if c.lightning_use_rope:
            cos, sin = rope_cos_sin(positions, d, c.rope_theta)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        r = H // Hk
        if r > 1:
            k = k.repeat_interleave(r, dim=1)
            v = v.repeat_interleave(r, dim=1)
        return q, k, v, z

    def _lightning_out(self, i, o, z):
        """§3.9: o_norm over the full width, sigmoid(z) gate, o_proj."""
        c = self.cfg
        a = "model.layers.%d.self_attn." % i
        o = o.reshape(o.shape[0], -1)
        if c.use_output_norm:
            o = rms_norm(o, self.W(a + "o_norm.weight"), c.rms_norm_eps)
        if c.use_output_gate:
            o = o * torch.sigmoid(z)
        return o @ self.W(a + "o_proj.weight").t()

    def _sparse_qkv(self, i, x, positions):
        c = self.cfg
        a = "model.layers.%d.self_attn." % i
        L = x.shape[0]
        H, Hs, d = c.num_heads, c.num_kv_heads, c.head_dim
        q = (x @ self.W(a + "q_proj.weight").t()).reshape(L, H, d)
        k = (x @ self.W(a + "k_proj.weight").t()).reshape(L, Hs, d)
        v = (x @ self.W(a + "v_proj.weight").t()).reshape(L, Hs, d)
        if c.attn_use_rope:  # off for the released model (NoPE); cached keys are then rotated
            cos, sin = rope_cos_sin(positions, d, c.rope_theta)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
        return q, k, v

    def _sparse_out(self, i, x, att):
        c = self.cfg
        a = "model.layers.%d.self_attn." % i
        att = att.reshape(att.shape[0], -1)
        if c.attn_use_output_gate:
            att = att * torch.sigmoid(x @ self.W(a + "o_gate.weight").t())
        return att @ self.W(a + "o_proj.weight").t()

    def _regime_sparse(self, T, regime_len):
        Tr = T if regime_len is None else regime_len
        return Tr >= self.cfg.dense_len

    # ---- incremental path ----------------------------------------------------------------
    def forward(self, state, tokens, regime_len=None):
        """Process the call's tokens with the cache in `state` (updated in place).

        Query t of the call sits at absolute position p = C0 + t. Sparse layers decide the
        regime once per call: sparse iff T_regime >= dense_len, T_regime = regime_len if given
        else the length after the call. Returns logits [Lq, V] (float64)."""
        c = self.cfg
        tokens = list(tokens)
        Lq = len(tokens)
        C0 = state.length
        T = C0 + Lq
        positions = list(range(C0, T))
        h = self._embed(tokens)
        alpha = c.residual_scale
        sparse = self._regime_sparse(T, regime_len)
        for i, m in enumerate(c.mixers):
            p = "model.layers.%d." % i
            x = rms_norm(h, self.W(p + "input_layernorm.weight"), c.rms_norm_eps)
            if m == "L":
                q, k, v, z = self._lightning_qkvz(i, x, positions)
                o, state.S[i] = gla_recurrent(q, k, v, self.g, c.lightning_qk_scale, state.S[i])
                a = self._lightning_out(i, o, z)
            else:
                a = self._sparse_layer_incremental(i, x, state, C0, positions, sparse)
            h = h + alpha * a
            x = rms_norm(h, self.W(p + "post_attention_layernorm.weight"), c.rms_norm_eps)
            h = h + alpha * self._mlp(i, x)
        state.length = T
        return self._logits(h)

    def _sparse_layer_incremental(self, i, x, state, C0, positions, sparse):
        c = self.cfg
        q, k, v = self._sparse_qkv(i, x, positions)
        Lq = q.shape[0]
        T_old = state.K[i].shape[0]
        assert T_old == C0
        # Append k, v before attending (new tokens attend to themselves).
        state.K[i] = torch.cat([state.K[i], k], 0)
        state.V[i] = torch.cat([state.V[i], v], 0)
        T = T_old + Lq
        K, V = state.K[i], state.V[i]
        # Incremental compressed keys: append chunks n(T_old) .. n(T)-1 (§4.4).
        ks, st = c.kernel_size, c.kernel_stride
        new1 = [K[j * st: j * st + ks].mean(0) for j in range(c.n1(T_old), c.n1(T))]
        new2 = [K[j * 4 * st: j * 4 * st + 4 * ks].mean(0) for j in range(c.n2(T_old), c.n2(T))]
        if new1:
            state.K1[i] = torch.cat([state.K1[i], torch.stack(new1, 0)], 0)
        if new2:
            state.K2[i] = torch.cat([state.K2[i], torch.stack(new2, 0)], 0)

        H, Hs, d = c.num_heads, c.num_kv_heads, c.head_dim
        G = H // Hs
        s = 1.0 / math.sqrt(d)
        NB = c.num_blocks(T)
        Kb = c.budget(T)
        out = torch.zeros(Lq, H, d, dtype=DT)
        for t in range(Lq):
            p = C0 + t
            qb = p // c.block_size
            for hk in range(Hs):
                qg = q[t, hk * G:(hk + 1) * G]                       # [G, d]
                if sparse:
                    sc = stage1_scores(qg, state.K1[i][:, hk], state.K2[i][:, hk], p, c, s)
                    B = pool_blocks(sc, qb, NB, c)
                    sel = select_blocks(B, qb, Kb, c)
                    keys = [j for blk in sel
                            for j in range(blk * c.block_size, min((blk + 1) * c.block_size, p + 1))]
                else:
                    keys = list(range(p + 1))
                idx = torch.tensor(keys, dtype=torch.long)
                kk, vv = K[idx, hk], V[idx, hk]                      # [n, d]
                prob = torch.softmax(s * (qg @ kk.t()), dim=-1)     # [G, n]
                out[t, hk * G:(hk + 1) * G] = prob @ vv
        return self._sparse_out(i, x, out)

    # ---- one-shot path (cross-check) ------------------------------------------------------
    def forward_full(self, tokens, regime_len=None, gla_chunk=16):
        """One-shot prefill of the whole sequence from an empty cache, written independently
        of forward(): chunked GLA (§3.7) and a vectorised InfLLM-v2 mask construction."""
        c = self.cfg
        tokens = list(tokens)
        T = len(tokens)
        positions = list(range(T))
        h = self._embed(tokens)
        alpha = c.residual_scale
        sparse = self._regime_sparse(T, regime_len)
        for i, m in enumerate(c.mixers):
            p = "model.layers.%d." % i
            x = rms_norm(h, self.W(p + "input_layernorm.weight"), c.rms_norm_eps)
            if m == "L":
                q, k, v, z = self._lightning_qkvz(i, x, positions)
                d = c.lightning_head_dim
                S0 = torch.zeros(c.lightning_nh, d, d, dtype=DT)
                o, _ = gla_chunked(q, k, v, self.g, c.lightning_qk_scale, S0, gla_chunk)
                a = self._lightning_out(i, o, z)
            else:
                q, k, v = self._sparse_qkv(i, x, positions)
                mask = self.sparse_key_mask(q, k) if sparse else \
                    torch.tril(torch.ones(T, T, dtype=torch.bool))[None].expand(c.num_kv_heads, T, T)
                a = self._sparse_out(i, x, masked_gqa_attention(q, k, v, mask))
            h = h + alpha * a
            x = rms_norm(h, self.W(p + "post_attention_layernorm.weight"), c.rms_norm_eps)
            h = h + alpha * self._mlp(i, x)
        return self._logits(h)

    def sparse_key_mask(self, q, k):
        """Vectorised InfLLM-v2 selection for a one-shot call: bool mask [Hs, T(query), T(key)]."""
        c = self.cfg
        T, H, d = q.shape
        Hs = k.shape[1]
        G = H // Hs
        s = 1.0 / math.sqrt(d)
        ks, st, bs = c.kernel_size, c.kernel_stride, c.block_size
        pos = torch.arange(T)
        # Compressed keys via unfold over time: [n, Hs, d].
        K1 = _window_means(k, ks, st)
        K2 = _window_means(k, 4 * ks, 4 * st)
        n1, n2 = K1.shape[0], K2.shape[0]
        vis1 = (torch.arange(n1)[None, :] * st + ks - 1) <= pos[:, None]            # [T, n1]
        vis2 = (torch.arange(n2)[None, :] * 4 * st + 4 * ks - 1) <= pos[:, None]    # [T, n2]
        kv_of_head = torch.arange(H) // G
        b = s * torch.einsum("thd,chd->thc", q, K1[:, kv_of_head])                  # [T, H, n1]
        a = s * torch.einsum("thd,chd->thc", q, K2[:, kv_of_head])                  # [T, H, n2]
        a = torch.where(vis2[:, None, :], a, torch.full_like(a, NEG_INF))
        if n2 > 0:
            lam = torch.logsumexp(a, dim=-1, keepdim=True)                           # -inf if none
        else:
            lam = torch.full((T, H, 1), NEG_INF, dtype=DT)
        none2 = torch.isinf(lam) & (lam < 0)
        P = torch.where(none2, torch.full_like(b, POS_INF), torch.exp(b - lam))
        P = torch.where(vis1[:, None, :], P, torch.zeros_like(P))
        score = P.reshape(T, Hs, G, n1).sum(dim=2)                                   # [T, Hs, n1]
        # Pooling matrix: member[k, c] iff chunk c overlaps block k.
        NB = c.num_blocks(T)
        kk = torch.arange(NB)[:, None]
        cc = torch.arange(n1)[None, :]
        member = (cc * st < (kk + 1) * bs) & (cc * st + ks > kk * bs)                 # [NB, n1]
        expanded = torch.where(member[None, None], score[:, :, None, :],
                               torch.full((1,), NEG_INF, dtype=DT))                  # [T,Hs,NB,n1]
        if n1 > 0:
            B = expanded.max(dim=-1)[0]
        else:
            B = torch.full((T, Hs, NB), NEG_INF, dtype=DT)
        qb = (pos // bs)[:, None]                                                    # [T, 1]
        blk = torch.arange(NB)[None, :]
        forced = (blk < c.init_blocks) | ((blk >= qb - c.local_blocks) & (blk <= qb))
        B = torch.where(forced[:, None, :], torch.full_like(B, POS_INF), B)
        # Top-k over past blocks by (forced first, score desc, index asc): two stable sorts,
        # the secondary key (score) first, then the primary (forced).
        order = torch.sort(B, dim=-1, descending=True, stable=True)[1]               # [T,Hs,NB]
        forced_sorted = torch.gather(forced[:, None, :].expand_as(B), 2, order)
        order = torch.gather(order, 2, torch.sort(forced_sorted.long(), dim=-1, descending=True,
                                                  stable=True)[1])
        past_sorted = order <= qb[:, :, None]
        rank = torch.cumsum(past_sorted.long(), dim=-1)
        take = past_sorted & (rank <= c.budget(T))
        selected = torch.zeros(T, Hs, NB, dtype=torch.bool)
        selected.scatter_(2, order, take)
        key_blk = torch.arange(T) // bs
        mask = selected[:, :, key_blk] & (torch.arange(T)[None, :] <= pos[:, None])[:, None, :]
        return mask.permute(1, 0, 2)                                                 # [Hs,T,T]


def _window_means(k, ks, st):
    T = k.shape[0]
    n = n_chunks(T, ks, st)
    if n == 0:
        return k.new_zeros((0,) + tuple(k.shape[1:]))
    return k.unfold(0, ks, st)[:n].mean(dim=-1)     # unfold -> [n, Hs, d, ks]


def masked_gqa_attention(q, k, v, mask):
    """q [T, H, d], k/v [S, Hs, d], mask [Hs, T, S] bool -> [T, H, d]."""
    T, H, d = q.shape
    Hs = k.shape[1]
    G = H // Hs
    kv = torch.arange(H) // G
    logits = torch.einsum("thd,shd->hts", q, k[:, kv]) / math.sqrt(d)
    logits = torch.where(mask[kv], logits, torch.full_like(logits, NEG_INF))
    prob = torch.softmax(logits, dim=-1)
    return torch.einsum("hts,shd->thd", prob, v[:, kv])


# ---------------------------------------------------------------------------------------------
# Driver helpers
# ---------------------------------------------------------------------------------------------

def run_schedule(model, tokens, prefill, chunk, regime_len="final", state=None):
    """Prefill `prefill` tokens in calls of at most `chunk` tokens, then decode the rest one
    token per call. regime_len: "final" = the prompt length for every prefill call (one-shot
    equivalent), None = per-call rule, or an int. Decode calls always use the per-call rule.
    Returns logits [len(tokens), V] (row r = after token r)."""
    state = model.new_state() if state is None else state
    rows = []
    rl = prefill if regime_len == "final" else regime_len
    for s0 in range(0, prefill, chunk):
        rows.append(model.forward(state, tokens[s0:min(s0 + chunk, prefill)], regime_len=rl))
    for t in range(prefill, len(tokens)):
        rows.append(model.forward(state, tokens[t:t + 1]))
    return torch.cat(rows, 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description="MiniCPM-SALA PyTorch reference")
    ap.add_argument("model", help="checkpoint directory (config.json + safetensors)")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--prefill", type=int, default=None, help="prompt tokens (default: all)")
    ap.add_argument("--chunk", type=int, default=None, help="prefill chunk size")
    ap.add_argument("--per-call-regime", action="store_true",
                    help="decide dense/sparse per call instead of by final prompt length")
    ap.add_argument("--out", help="write logits [T, V] float32 .npy here")
    args = ap.parse_args(argv)
    model = Model(args.model)
    toks = [int(t) for t in args.tokens.split(",") if t.strip()]
    prefill = len(toks) if args.prefill is None else args.prefill
    chunk = args.chunk or max(prefill, 1)
    logits = run_schedule(model, toks, prefill, chunk,
                          None if args.per_call_regime else "final")
    if args.out:
        np.save(args.out, logits.numpy().astype(np.float32))
    print("argmax per position:", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
