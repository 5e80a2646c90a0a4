"""Random tiny MiniCPM-SALA checkpoints for tests (config.json + model.safetensors, HF names).

Only used by the Python tests and as a stand-in for `sala init` while developing
make_goldens.py; the committed goldens are made from checkpoints written by `sala init`.
"""
import json
import os

import numpy as np

import safetensors_np
import sala_ref


def tiny_config(**overrides):
    """The goldens' tiny geometry (see tests/golden/tiny_config.json), with overrides.
    sparse_config entries may be overridden by passing sparse_config={...} (merged)."""
    cfg = {
        "architectures": ["MiniCPMSALAForCausalLM"],
        "model_type": "minicpm_sala",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "lightning_nh": 4,
        "lightning_nkv": 4,
        "lightning_head_dim": 16,
        "lightning_scale": "1/sqrt(d)",
        "mixer_types": ["minicpm4", "lightning-attn", "lightning-attn", "minicpm4"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "scale_emb": 12,
        "scale_depth": 1.4,
        "dim_model_base": 16,
        "hidden_act": "silu",
        "attn_use_rope": False,
        "attn_use_output_gate": True,
        "lightning_use_rope": True,
        "qk_norm": True,
        "use_output_norm": True,
        "use_output_gate": True,
        "tie_word_embeddings": False,
        "sparse_config": {"block_size": 16, "kernel_size": 8, "kernel_stride": 4,
                          "window_size": 64, "topk": 4, "init_blocks": 1,
                          "use_nope": False, "dense_len": 256},
        "bos_token_id": 1,
        "eos_token_id": [2, 4],
        "pad_token_id": 2,
        "torch_dtype": "float32",
    }
    sc = overrides.pop("sparse_config", None)
    cfg.update(overrides)
    if sc:
        cfg["sparse_config"] = dict(cfg["sparse_config"], **sc)
    return cfg


def random_tensors(config, seed):
    """Random weights with HF names for `config` (a dict), float32 numpy arrays."""
    c = sala_ref.Config(config)
    rng = np.random.RandomState(seed)
    D, I, V = c.hidden_size, c.intermediate_size, c.vocab_size

    def lin(out_f, in_f):
        return (rng.randn(out_f, in_f) / np.sqrt(in_f)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.randn(n)).astype(np.float32)

    t = {
        "model.embed_tokens.weight": (0.1 * rng.randn(V, D)).astype(np.float32),
        "model.norm.weight": norm(D),
        "lm_head.weight": lin(V, D),
    }
    for i, m in enumerate(c.mixers):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "mlp.gate_proj.weight"] = lin(I, D)
        t[p + "mlp.up_proj.weight"] = lin(I, D)
        t[p + "mlp.down_proj.weight"] = lin(D, I)
        a = p + "self_attn."
        if m == "S":
            H, Hs, d = c.num_heads, c.num_kv_heads, c.head_dim
            t[a + "q_proj.weight"] = lin(H * d, D) * 2.0   # sharper attention
            t[a + "k_proj.weight"] = lin(Hs * d, D) * 2.0
            t[a + "v_proj.weight"] = lin(Hs * d, D)
            t[a + "o_proj.weight"] = lin(D, H * d)
            t[a + "o_gate.weight"] = lin(H * d, D)
        else:
            H, Hk, d = c.lightning_nh, c.lightning_nkv, c.lightning_head_dim
            t[a + "q_proj.weight"] = lin(H * d, D)
            t[a + "k_proj.weight"] = lin(Hk * d, D)
            t[a + "v_proj.weight"] = lin(Hk * d, D)
            t[a + "o_proj.weight"] = lin(D, H * d)
            t[a + "z_proj.weight"] = lin(H * d, D)
            t[a + "q_norm.weight"] = norm(d)
            t[a + "k_norm.weight"] = norm(d)
            t[a + "o_norm.weight"] = norm(H * d)
    return t


def write_checkpoint(outdir, config, seed, dtype="F32"):
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    safetensors_np.save_file(random_tensors(config, seed),
                             os.path.join(outdir, "model.safetensors"), dtype=dtype)
    return outdir
