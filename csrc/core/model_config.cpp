#include "edgerunner/model_config.h"

#include <cmath>
#include <stdexcept>

namespace edgerunner {
namespace {

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
}

[[noreturn]] void bad(const GGUFFile& f, const std::string& what) {
    throw std::invalid_argument(f.path() + ": " + what);
}

int64_t required(const GGUFFile& f, const std::string& key) {
    const GGUFValue* v = f.find(key);
    if (!v) bad(f, "metadata key '" + key + "' is missing; the file is not a complete model");
    if (v->type == GGUFValueType::ARRAY)
        bad(f, "metadata key '" + key + "' holds a per-layer array, which this build does not support");
    uint64_t x = f.get_uint(key, 0);
    if (x == 0 || x > (uint64_t{1} << 31)) bad(f, "metadata key '" + key + "' = " + std::to_string(x) + " is out of range");
    return static_cast<int64_t>(x);
}

}  // namespace

const std::vector<std::string>& supported_architectures() {
    static const std::vector<std::string> archs = {"llama", "qwen2", "qwen3", "gemma3", "phi3"};
    return archs;
}

ModelConfig read_model_config(const GGUFFile& f) {
    ModelConfig c;
    c.arch = std::string(f.get_string("general.architecture", ""));
    if (c.arch.empty()) bad(f, "metadata key 'general.architecture' is missing");
    bool known = false;
    for (const auto& a : supported_architectures()) known |= a == c.arch;
    if (!known)
        bad(f, "architecture '" + c.arch + "' is not supported by this build; supported: " + join(supported_architectures()));
    const std::string a = c.arch + ".";

    c.n_embd = required(f, a + "embedding_length");
    c.n_layer = required(f, a + "block_count");
    c.n_head = required(f, a + "attention.head_count");
    c.n_head_kv = f.find(a + "attention.head_count_kv") ? required(f, a + "attention.head_count_kv") : c.n_head;
    c.n_ff = required(f, a + "feed_forward_length");
    c.n_ctx_train = f.find(a + "context_length") ? required(f, a + "context_length") : 4096;
    c.head_dim = f.find(a + "attention.key_length") ? required(f, a + "attention.key_length") : c.n_embd / c.n_head;
    c.head_dim_v = f.find(a + "attention.value_length") ? required(f, a + "attention.value_length") : c.head_dim;
    c.norm_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
    c.rope_base = static_cast<float>(f.get_float(a + "rope.freq_base", 10000.0));
    c.rope_dim = f.find(a + "rope.dimension_count") ? required(f, a + "rope.dimension_count") : c.head_dim;
    c.sliding_window = static_cast<int64_t>(f.get_uint(a + "attention.sliding_window", 0));

    if (c.n_head % c.n_head_kv != 0)
        bad(f, "attention.head_count " + std::to_string(c.n_head) + " is not a multiple of head_count_kv " +
                   std::to_string(c.n_head_kv));
    if (c.head_dim != c.head_dim_v) bad(f, "key_length != value_length is not supported");
    if (c.head_dim % 2 != 0 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim)
        bad(f, "rope.dimension_count " + std::to_string(c.rope_dim) + " does not fit head size " + std::to_string(c.head_dim));

    const GGUFTensorInfo* embd = f.find_tensor("token_embd.weight");
    if (!embd || embd->shape.size() != 2)
        bad(f, "tensor 'token_embd.weight' is missing or not 2-D");
    c.n_vocab = static_cast<int64_t>(embd->shape[1]);
    c.tied_output = f.find_tensor("output.weight") == nullptr;
    c.rope_freq_factors = f.find_tensor("rope_freqs.weight") != nullptr;
    if (f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight")) {
        if (!f.find_tensor("rope_factors_long.weight") || !f.find_tensor("rope_factors_short.weight"))
            bad(f, "LongRoPE needs both rope_factors_long and rope_factors_short");
        c.rope_longrope = true;
        c.rope_orig_ctx = f.find(a + "rope.scaling.original_context_length") ? required(f, a + "rope.scaling.original_context_length")
                                                                              : c.n_ctx_train;
        const double factor = static_cast<double>(c.n_ctx_train) / static_cast<double>(c.rope_orig_ctx);
        const double fallback = factor > 1 ? std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(c.rope_orig_ctx))) : 1.0;
        c.rope_attn_factor = static_cast<float>(f.get_float(a + "rope.scaling.attn_factor", fallback));
    }

    std::string scaling(f.get_string(a + "rope.scaling.type", "none"));
    if (scaling == "linear") {
        double factor = f.get_float(a + "rope.scaling.factor", 1.0);
        if (!(factor > 0)) bad(f, "rope.scaling.factor must be positive");
        c.rope_linear_scale = static_cast<float>(1.0 / factor);
    } else if (scaling != "none" && !(scaling == "llama3" || scaling.empty())) {
        bad(f, "RoPE scaling type '" + scaling + "' is not supported; supported: none, linear, llama3 (rope_freqs)");
    }

    if (c.arch == "llama") {
        c.rope_style = RopeStyle::Adjacent;
    } else if (c.arch == "qwen2") {
        c.rope_style = RopeStyle::Neox;
        c.qkv_bias = true;
    } else if (c.arch == "qwen3") {
        c.rope_style = RopeStyle::Neox;
        c.qk_norm = true;
    } else if (c.arch == "phi3") {
        c.rope_style = RopeStyle::Neox;
    } else if (c.arch == "gemma3") {
        // Gemma 3: 5 local layers (window, rope base 10000 unless the file says) per global one.
        c.rope_style = RopeStyle::Neox;
        c.qk_norm = true;
        c.post_norms = true;
        c.gelu_gate = true;
        c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
        c.sliding_window_pattern = static_cast<int64_t>(f.get_uint(a + "attention.sliding_window_pattern", 6));
        c.rope_base_swa = static_cast<float>(f.get_float(a + "rope.freq_base_swa", 10000.0));
    }
    return c;
}

}  // namespace edgerunner
