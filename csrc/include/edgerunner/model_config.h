// A model's hyperparameters, read from GGUF metadata with the upstream (llama.cpp) key names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "edgerunner/gguf.h"

namespace edgerunner {

// How RoPE pairs the dimensions of a head. llama.cpp's converter permutes Llama's Q/K weights
// so that adjacent dimensions (2i, 2i+1) rotate together; Qwen, Gemma and Phi-3 keep
// Hugging Face's layout, rotating dimension i with i + head_dim/2 ("neox").
enum class RopeStyle { Adjacent, Neox };

struct ModelConfig {
    std::string arch;
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;       // key/query head size
    int64_t head_dim_v = 0;     // value head size
    int64_t n_ff = 0;
    int64_t n_ctx_train = 0;
    float norm_eps = 1e-5f;

    RopeStyle rope_style = RopeStyle::Adjacent;
    int64_t rope_dim = 0;       // dimensions of each head that rotate (the rest pass through)
    float rope_base = 10000.0f;
    float rope_linear_scale = 1.0f;  // positions are multiplied by this (1 / scaling factor)
    bool rope_freq_factors = false;  // rope_freqs.weight divides each pair's frequency (Llama 3.1+)
    // LongRoPE (Phi-3 128k): rope_factors_short / _long divide the frequencies (long when the
    // context exceeds rope_orig_ctx), and cos/sin are scaled by rope_attn_factor.
    bool rope_longrope = false;
    int64_t rope_orig_ctx = 0;
    float rope_attn_factor = 1.0f;

    bool qkv_bias = false;      // qwen2: biases on the Q, K and V projections
    bool qk_norm = false;       // qwen3: RMSNorm over each Q and K head before RoPE
    bool tied_output = false;   // no output.weight: the LM head reuses token_embd
    int64_t sliding_window = 0; // 0: full attention
    // Interleaved local/global attention (gemma3): with a pattern N > 0, layer i is global
    // (full attention, rope_base) when (i + 1) % N == 0, else local (the window, rope_base_swa).
    // 0: every layer uses the window (when there is one).
    int64_t sliding_window_pattern = 0;
    float rope_base_swa = 0.0f;  // 0: rope_base

    // gemma3: embeddings × embd_scale, RMSNorms after attention and FFN too, GELU (tanh) gate.
    float embd_scale = 1.0f;
    bool post_norms = false;
    bool gelu_gate = false;

    bool layer_is_local(int64_t layer) const {
        return sliding_window > 0 && (sliding_window_pattern == 0 || (layer + 1) % sliding_window_pattern != 0);
    }
};

// The architectures this build runs, for error messages.
const std::vector<std::string>& supported_architectures();

// Reads and checks the hyperparameters; throws std::invalid_argument naming the key or the
// unsupported feature (and listing what is supported).
ModelConfig read_model_config(const GGUFFile& file);

}  // namespace edgerunner
