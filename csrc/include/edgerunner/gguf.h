// GGUF reader: memory-maps a file (versions 2 and 3, little-endian) and checks every count,
// length, offset and size against the file before anything is used. Strings and numeric
// arrays are views into the mapping, so the vocabulary of a 128k-token model costs no copies.
// Anything malformed raises GGUFError naming the field and its byte offset.
//
// Split models (llama.cpp's gguf-split: <name>-00001-of-0000N.gguf ... -0000N-of-0000N.gguf,
// metadata split.no / split.count / split.tensors.count, hyperparameters in the first shard
// only) open from their first shard: the other shards are mapped too and their tensors join
// one list, each tensor's data staying in its own shard's mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "edgerunner/tensor_type.h"

namespace edgerunner {

class GGUFError : public std::runtime_error {
public:
    GGUFError(const std::string& message, std::string field, uint64_t offset)
        : std::runtime_error(message), field_(std::move(field)), offset_(offset) {}
    const std::string& field() const { return field_; }  // e.g. "tensor_count", "tensor 'x' offset"
    uint64_t offset() const { return offset_; }          // byte offset in the file
private:
    std::string field_;
    uint64_t offset_;
};

enum class GGUFValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_value_type_name(GGUFValueType type);

// One metadata value. Scalars are widened (integers to int64/uint64, floats to double);
// arrays of numbers or bools stay packed little-endian bytes inside the mapping.
struct GGUFValue {
    GGUFValueType type = GGUFValueType::UINT8;
    uint64_t u = 0;       // UINT8, UINT16, UINT32, UINT64, BOOL
    int64_t i = 0;        // INT8, INT16, INT32, INT64
    double f = 0;         // FLOAT32, FLOAT64
    std::string_view s;   // STRING (UTF-8, checked)

    GGUFValueType elem_type = GGUFValueType::UINT8;  // ARRAY only
    uint64_t count = 0;                              // ARRAY only
    const uint8_t* raw = nullptr;                    // ARRAY of numbers/bools: count packed elements
    std::vector<std::string_view> strings;           // ARRAY of STRING
    std::vector<GGUFValue> arrays;                   // ARRAY of ARRAY

    bool is_integer() const;
    // Numeric element k of a numeric array, widened; bounds- and type-checked by the caller.
    double number_at(uint64_t k) const;
};

struct GGUFKeyValue {
    std::string_view key;
    GGUFValue value;
    uint64_t offset;  // where the key-value pair starts in the file
};

struct GGUFTensorInfo {
    std::string_view name;
    std::vector<uint64_t> shape;  // GGUF order: shape[0] is the contiguous (row) dimension
    TensorType type;
    uint64_t offset;      // relative to the data section
    uint64_t n_elements;
    uint64_t n_bytes;
    uint64_t info_offset;  // where this tensor's info record starts in its file
    uint32_t shard = 0;    // the file of a split model that holds it (index into shards())
};

// One mapped file of a model: the whole model, or one shard of a split model.
struct GGUFShard {
    std::string path;
    const uint8_t* base = nullptr;
    uint64_t size = 0;
    uint64_t data_offset = 0;  // where this file's data section starts
};

class GGUFFile {
public:
    // Maps `path` read-only and parses it; the first shard of a split model brings in the
    // others (named as gguf-split names them, in the same folder). Throws GGUFError for
    // malformed content or an inconsistent or incomplete split, and std::system_error when a
    // file cannot be opened or mapped.
    static GGUFFile open(const std::string& path);
    // Parses a caller-owned buffer, which must outlive the returned object (fuzzing, tests).
    static GGUFFile parse(const uint8_t* data, size_t size, std::string name = "<memory>");

    const std::string& path() const { return name_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    uint64_t file_size() const { return size_; }  // of this (first) file; shards() has each file's

    const std::vector<GGUFKeyValue>& metadata() const { return metadata_; }
    const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
    const GGUFValue* find(std::string_view key) const;
    const GGUFTensorInfo* find_tensor(std::string_view name) const;

    // Typed metadata look-ups for model configs: the fallback when the key is absent,
    // GGUFError when it is present with an incompatible type.
    uint64_t get_uint(std::string_view key, uint64_t fallback) const;
    double get_float(std::string_view key, double fallback) const;
    std::string_view get_string(std::string_view key, std::string_view fallback) const;

    // Every mapped file, in split order: one entry for an ordinary file.
    const std::vector<GGUFShard>& shards() const { return shards_; }

    // The tensor's bytes inside its file's mapping (n_bytes long).
    const uint8_t* tensor_data(const GGUFTensorInfo& t) const {
        const GGUFShard& s = shards_[t.shard];
        return s.base + s.data_offset + t.offset;
    }
    const uint8_t* base() const { return base_; }
    // Keeps the mappings alive for views handed out (e.g. numpy arrays over tensor data).
    std::shared_ptr<const void> mapping() const { return mapping_; }

private:
    GGUFFile() = default;
    static GGUFFile open_file(const std::string& path);
    void parse_all();
    void join_split_shards();

    std::string name_;
    std::shared_ptr<const void> mapping_;
    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<GGUFKeyValue> metadata_;
    std::vector<GGUFTensorInfo> tensors_;
    std::vector<GGUFShard> shards_;
};

}  // namespace edgerunner
