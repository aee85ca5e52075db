"""An independent float64 NumPy forward pass of the llama family, for the tests.

It reads the GGUF with the gguf package and dequantizes with gguf.quants (not with
edgerunner), follows llama.cpp's conventions (adjacent-pair RoPE for `llama`, whose Q/K weights
the converter permuted; half-split RoPE for qwen and phi3), splits phi3's fused attn_qkv and
gate+up tensors, and applies `rope_freqs`, linear RoPE scaling and phi3's LongRoPE (the short
factors up to the original context, the long ones beyond, cos/sin × the attention factor),
which transformers' GGUF loader ignores. `n_ctx` is the engine's context length (LongRoPE picks
its factors by it); by default the model's.
"""

from __future__ import annotations

import gguf
import numpy as np


class ReferenceModel:
    def __init__(self, path, n_ctx=None):
        r = gguf.GGUFReader(path)
        self.md = {k: f.contents() for k, f in r.fields.items()}
        arch = self.md["general.architecture"]
        self.arch = arch
        get = lambda k, d=None: self.md.get(f"{arch}.{k}", d)  # noqa: E731
        self.n_layer = get("block_count")
        self.n_head = get("attention.head_count")
        self.n_kv = get("attention.head_count_kv", self.n_head)
        dim = get("embedding_length")
        self.head_dim = get("attention.key_length", dim // self.n_head)
        self.eps = get("attention.layer_norm_rms_epsilon", 1e-5)
        self.base = get("rope.freq_base", 10000.0)
        self.window = get("attention.sliding_window", 0)  # Mistral style: every layer
        scaling = get("rope.scaling.type")
        self.pos_scale = 1.0 / get("rope.scaling.factor", 1.0) if scaling == "linear" else 1.0
        self.w = {}
        for t in r.tensors:
            x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
            self.w[t.name] = x.reshape([int(d) for d in reversed(t.shape)]) if len(t.shape) > 1 else x.reshape(-1)
        self.out = self.w.get("output.weight", self.w["token_embd.weight"])
        if arch == "phi3":  # fused tensors: q, k, v rows; gate rows, then up rows
            q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv * self.head_dim
            for i in range(self.n_layer):
                p = f"blk.{i}."
                qkv = self.w.pop(p + "attn_qkv.weight")
                self.w[p + "attn_q.weight"], self.w[p + "attn_k.weight"], self.w[p + "attn_v.weight"] = \
                    qkv[:q_dim], qkv[q_dim:q_dim + kv_dim], qkv[q_dim + kv_dim:]
                gate_up = self.w.pop(p + "ffn_up.weight")
                half = gate_up.shape[0] // 2
                self.w[p + "ffn_gate.weight"], self.w[p + "ffn_up.weight"] = gate_up[:half], gate_up[half:]
        inv = 1.0 / self.base ** (np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        if "rope_freqs.weight" in self.w:
            inv = inv / self.w["rope_freqs.weight"]
        self.attn_factor = 1.0
        if "rope_factors_long.weight" in self.w:
            ctx_train = get("context_length")
            orig = get("rope.scaling.original_context_length", ctx_train)
            n_ctx = n_ctx or min(ctx_train, 4096)
            inv = inv / self.w["rope_factors_long.weight" if n_ctx > orig else "rope_factors_short.weight"]
            self.attn_factor = get("rope.scaling.attn_factor", 1.0)
        self.inv_freq = inv

    def norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, positions):  # x: (T, H, D)
        ang = (positions * self.pos_scale)[:, None] * self.inv_freq[None, :]
        cos, sin = np.cos(ang)[:, None, :] * self.attn_factor, np.sin(ang)[:, None, :] * self.attn_factor
        y = x.copy()
        if self.arch == "llama":
            a, b = x[..., 0::2], x[..., 1::2]
            y[..., 0::2], y[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        else:
            h = self.head_dim // 2
            a, b = x[..., :h], x[..., h:]
            y[..., :h], y[..., h:] = a * cos - b * sin, a * sin + b * cos
        return y

    def logits(self, ids):
        w, T, D = self.w, len(ids), self.head_dim
        x = self.w["token_embd.weight"][np.asarray(ids)]
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        if self.window:  # a query at t sees keys t - window + 1 .. t
            mask += np.tril(np.full((T, T), -np.inf), -self.window)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.norm(x, w[p + "attn_norm.weight"])
            q, k, v = (h @ w[p + f"attn_{n}.weight"].T + w.get(p + f"attn_{n}.bias", 0) for n in "qkv")
            q, k, v = q.reshape(T, self.n_head, D), k.reshape(T, self.n_kv, D), v.reshape(T, self.n_kv, D)
            if p + "attn_q_norm.weight" in w:
                q, k = self.norm(q, w[p + "attn_q_norm.weight"]), self.norm(k, w[p + "attn_k_norm.weight"])
            q, k = self.rope(q, pos), self.rope(k, pos)
            rep = self.n_head // self.n_kv
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = np.einsum("hts,shd->thd", s, v).reshape(T, -1)
            x = x + att @ w[p + "attn_output.weight"].T
            h = self.norm(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        return self.norm(x, w["output_norm.weight"]) @ self.out.T
