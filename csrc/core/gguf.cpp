#include "edgerunner/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <unordered_set>

namespace edgerunner {
namespace {

constexpr uint32_t kMaxDims = 4;          // ggml tensors have at most 4 dimensions
constexpr int kMaxArrayDepth = 8;         // nested arrays deeper than this are refused
constexpr uint64_t kDefaultAlignment = 32;

size_t scalar_size(GGUFValueType t) {
    switch (t) {
        case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::BOOL: return 1;
        case GGUFValueType::UINT16: case GGUFValueType::INT16: return 2;
        case GGUFValueType::UINT32: case GGUFValueType::INT32: case GGUFValueType::FLOAT32: return 4;
        case GGUFValueType::UINT64: case GGUFValueType::INT64: case GGUFValueType::FLOAT64: return 8;
        default: return 0;  // STRING, ARRAY: variable size
    }
}

bool valid_utf8(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t n = s.size(), i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) { ++i; continue; }
        size_t len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + len > n) return false;
        for (size_t k = 1; k < len; ++k) {
            if ((p[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
            return false;
        i += len;
    }
    return true;
}

// A name for an error message: at most 80 characters, cut on a character boundary, with
// bytes that are not printable ASCII or UTF-8 shown as \xNN.
std::string quoted(std::string_view s) {
    std::string out = "'";
    size_t i = 0, shown = 0;
    while (i < s.size() && shown < 80) {
        auto c = static_cast<unsigned char>(s[i]);
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len > 1 && i + len <= s.size() && valid_utf8(s.substr(i, len))) {
            out.append(s.substr(i, len));
        } else if (len == 1 && c >= 0x20 && c < 0x7F) {
            out += static_cast<char>(c);
        } else {
            static const char hex[] = "0123456789abcdef";
            out += "\\x";
            out += hex[c >> 4];
            out += hex[c & 15];
            len = 1;
        }
        i += len;
        ++shown;
    }
    if (i < s.size()) out += "...";
    return out + "'";
}

// Bounds-checked little-endian reader over the file bytes. Every read names its field so a
// failure can say what was being read and where.
class Cursor {
public:
    Cursor(const uint8_t* data, uint64_t size, const std::string& file)
        : data_(data), size_(size), file_(file) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }

    [[noreturn]] void fail(const std::string& field, uint64_t at, const std::string& what) const {
        throw GGUFError(file_ + ": " + field + " at offset " + std::to_string(at) + ": " + what, field, at);
    }

    const uint8_t* take(uint64_t n, const std::string& field) {
        if (n > remaining())
            fail(field, pos_, "needs " + std::to_string(n) + " bytes but the file ends after " +
                                  std::to_string(remaining()) + " (truncated file?)");
        const uint8_t* p = data_ + pos_;
        pos_ += n;
        return p;
    }

    template <typename T>
    T read(const std::string& field) {
        T v;
        std::memcpy(&v, take(sizeof(T), field), sizeof(T));
        return v;
    }

    std::string_view string(const std::string& field) {
        uint64_t at = pos_;
        uint64_t len = read<uint64_t>(field + " length");
        if (len > remaining())
            fail(field, at, "string length " + std::to_string(len) + " runs past the end of the file (" +
                                std::to_string(remaining()) + " bytes left)");
        std::string_view s(reinterpret_cast<const char*>(take(len, field)), len);
        if (!valid_utf8(s)) fail(field, at, "string is not valid UTF-8");
        return s;
    }

private:
    const uint8_t* data_;
    uint64_t size_;
    uint64_t pos_ = 0;
    const std::string& file_;
};

GGUFValueType read_value_type(Cursor& c, const std::string& field) {
    uint64_t at = c.pos();
    uint32_t t = c.read<uint32_t>(field);
    if (t > static_cast<uint32_t>(GGUFValueType::FLOAT64))
        c.fail(field, at, "unknown value type " + std::to_string(t) + " (known: 0..12)");
    return static_cast<GGUFValueType>(t);
}

void read_scalar(Cursor& c, GGUFValue& v, const std::string& field) {
    uint64_t at = c.pos();
    switch (v.type) {
        case GGUFValueType::UINT8: v.u = c.read<uint8_t>(field); break;
        case GGUFValueType::INT8: v.i = c.read<int8_t>(field); break;
        case GGUFValueType::UINT16: v.u = c.read<uint16_t>(field); break;
        case GGUFValueType::INT16: v.i = c.read<int16_t>(field); break;
        case GGUFValueType::UINT32: v.u = c.read<uint32_t>(field); break;
        case GGUFValueType::INT32: v.i = c.read<int32_t>(field); break;
        case GGUFValueType::UINT64: v.u = c.read<uint64_t>(field); break;
        case GGUFValueType::INT64: v.i = c.read<int64_t>(field); break;
        case GGUFValueType::FLOAT32: v.f = c.read<float>(field); break;
        case GGUFValueType::FLOAT64: v.f = c.read<double>(field); break;
        case GGUFValueType::BOOL: {
            uint8_t b = c.read<uint8_t>(field);
            if (b > 1) c.fail(field, at, "bool value " + std::to_string(b) + " is neither 0 nor 1");
            v.u = b;
            break;
        }
        case GGUFValueType::STRING: v.s = c.string(field); break;
        case GGUFValueType::ARRAY: break;  // handled by read_value
    }
}

void read_value(Cursor& c, GGUFValue& v, const std::string& field, int depth) {
    if (v.type != GGUFValueType::ARRAY) return read_scalar(c, v, field);
    uint64_t at = c.pos();
    if (depth >= kMaxArrayDepth)
        c.fail(field, at, "arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
    v.elem_type = read_value_type(c, field + " element type");
    uint64_t count_at = c.pos();
    v.count = c.read<uint64_t>(field + " element count");
    // Every element takes at least one byte (8 for strings and arrays): a count the rest of
    // the file cannot hold is refused before anything is allocated for it.
    size_t elem = scalar_size(v.elem_type);
    uint64_t min_elem = elem ? elem : (v.elem_type == GGUFValueType::STRING ? 8 : 12);
    if (v.count > c.remaining() / min_elem)
        c.fail(field + " element count", count_at,
               "array of " + std::to_string(v.count) + " " + std::string(gguf_value_type_name(v.elem_type)) +
                   " elements cannot fit in the " + std::to_string(c.remaining()) + " bytes left");
    if (elem) {
        v.raw = c.take(v.count * elem, field);
        if (v.elem_type == GGUFValueType::BOOL)
            for (uint64_t k = 0; k < v.count; ++k)
                if (v.raw[k] > 1) c.fail(field, at, "bool element " + std::to_string(k) + " is neither 0 nor 1");
    } else if (v.elem_type == GGUFValueType::STRING) {
        v.strings.reserve(v.count);
        for (uint64_t k = 0; k < v.count; ++k) v.strings.push_back(c.string(field + "[" + std::to_string(k) + "]"));
    } else {
        v.arrays.resize(v.count);
        for (uint64_t k = 0; k < v.count; ++k) {
            std::string sub = field + "[" + std::to_string(k) + "]";
            v.arrays[k].type = GGUFValueType::ARRAY;
            read_value(c, v.arrays[k], sub, depth + 1);
        }
    }
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

struct Mapping {
    void* addr = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (addr) munmap(addr, size);
    }
};

}  // namespace

std::string_view gguf_value_type_name(GGUFValueType type) {
    static constexpr std::string_view names[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                                  "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
    auto k = static_cast<uint32_t>(type);
    return k < std::size(names) ? names[k] : "UNKNOWN";
}

bool GGUFValue::is_integer() const {
    switch (type) {
        case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::UINT16: case GGUFValueType::INT16:
        case GGUFValueType::UINT32: case GGUFValueType::INT32: case GGUFValueType::UINT64: case GGUFValueType::INT64:
            return true;
        default: return false;
    }
}

double GGUFValue::number_at(uint64_t k) const {
    const uint8_t* p = raw + k * scalar_size(elem_type);
    auto load = [p](auto v) { std::memcpy(&v, p, sizeof(v)); return v; };
    switch (elem_type) {
        case GGUFValueType::UINT8: case GGUFValueType::BOOL: return load(uint8_t{});
        case GGUFValueType::INT8: return load(int8_t{});
        case GGUFValueType::UINT16: return load(uint16_t{});
        case GGUFValueType::INT16: return load(int16_t{});
        case GGUFValueType::UINT32: return load(uint32_t{});
        case GGUFValueType::INT32: return load(int32_t{});
        case GGUFValueType::UINT64: return static_cast<double>(load(uint64_t{}));
        case GGUFValueType::INT64: return static_cast<double>(load(int64_t{}));
        case GGUFValueType::FLOAT32: return load(float{});
        case GGUFValueType::FLOAT64: return load(double{});
        default: return 0;
    }
}

GGUFFile GGUFFile::open(const std::string& path) {
    GGUFFile f = open_file(path);
    f.join_split_shards();
    return f;
}

GGUFFile GGUFFile::open_file(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + path);
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        throw std::system_error(err, std::generic_category(), "cannot stat " + path);
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw GGUFError(path + ": not a regular file", "file", 0);
    }
    auto map = std::make_shared<Mapping>();
    map->size = static_cast<size_t>(st.st_size);
    if (map->size > 0) {
        void* addr = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (addr == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw std::system_error(err, std::generic_category(), "cannot map " + path);
        }
        map->addr = addr;
    }
    ::close(fd);
    GGUFFile f;
    f.name_ = path;
    f.base_ = static_cast<const uint8_t*>(map->addr);
    f.size_ = map->size;
    f.mapping_ = map;
    f.parse_all();
    f.shards_ = {GGUFShard{f.name_, f.base_, f.size_, f.data_offset_}};
    return f;
}

GGUFFile GGUFFile::parse(const uint8_t* data, size_t size, std::string name) {
    GGUFFile f;
    f.name_ = std::move(name);
    f.base_ = data;
    f.size_ = size;
    f.parse_all();
    f.shards_ = {GGUFShard{f.name_, f.base_, f.size_, f.data_offset_}};
    return f;
}

void GGUFFile::parse_all() {
    static const uint8_t empty = 0;
    Cursor c(base_ ? base_ : &empty, size_, name_);

    const uint8_t* magic = c.take(4, "magic");
    if (std::memcmp(magic, "GGUF", 4) != 0)
        c.fail("magic", 0, "not a GGUF file (expected the bytes 'GGUF', found " +
                               quoted(std::string_view(reinterpret_cast<const char*>(magic), 4)) + ")");
    version_ = c.read<uint32_t>("version");
    if (version_ == 0x02000000u || version_ == 0x03000000u)
        c.fail("version", 4, "big-endian GGUF files are not supported; convert it to little-endian");
    if (version_ == 1) c.fail("version", 4, "GGUF version 1 is obsolete and not supported; re-convert the model (versions 2 and 3 are read)");
    if (version_ != 2 && version_ != 3)
        c.fail("version", 4, "unsupported GGUF version " + std::to_string(version_) + " (versions 2 and 3 are read)");

    uint64_t tensor_count = c.read<uint64_t>("tensor_count");
    uint64_t kv_count = c.read<uint64_t>("metadata_kv_count");
    // A tensor info takes at least 8 (name) + 4 (n_dims) + 4 (type) + 8 (offset) bytes and a
    // key-value pair at least 8 (key) + 4 (type) + 1 bytes.
    if (kv_count > c.remaining() / 13)
        c.fail("metadata_kv_count", 16, std::to_string(kv_count) + " key-value pairs cannot fit in a file of " +
                                            std::to_string(size_) + " bytes");
    if (tensor_count > c.remaining() / 24)
        c.fail("tensor_count", 8, std::to_string(tensor_count) + " tensor infos cannot fit in a file of " +
                                      std::to_string(size_) + " bytes");

    std::unordered_set<std::string_view> keys;
    metadata_.reserve(kv_count);
    for (uint64_t k = 0; k < kv_count; ++k) {
        GGUFKeyValue kv;
        kv.offset = c.pos();
        kv.key = c.string("metadata key #" + std::to_string(k));
        if (kv.key.empty()) c.fail("metadata key #" + std::to_string(k), kv.offset, "empty key");
        if (!keys.insert(kv.key).second) c.fail("metadata key " + quoted(kv.key), kv.offset, "duplicate key");
        std::string field = "metadata " + quoted(kv.key);
        kv.value.type = read_value_type(c, field + " type");
        read_value(c, kv.value, field, 0);
        metadata_.push_back(std::move(kv));
    }

    if (const GGUFKeyValue* kv = [&]() -> const GGUFKeyValue* {
            for (const auto& m : metadata_)
                if (m.key == "general.alignment") return &m;
            return nullptr;
        }()) {
        if (kv->value.type != GGUFValueType::UINT32)
            c.fail("metadata 'general.alignment'", kv->offset,
                   "must be UINT32, found " + std::string(gguf_value_type_name(kv->value.type)));
        uint64_t a = kv->value.u;
        if (a == 0 || (a & (a - 1)) != 0)
            c.fail("metadata 'general.alignment'", kv->offset, "alignment " + std::to_string(a) + " is not a power of two");
        alignment_ = a;
    } else {
        alignment_ = kDefaultAlignment;
    }

    std::unordered_set<std::string_view> names;
    tensors_.reserve(tensor_count);
    for (uint64_t k = 0; k < tensor_count; ++k) {
        GGUFTensorInfo t;
        t.info_offset = c.pos();
        t.name = c.string("tensor #" + std::to_string(k) + " name");
        std::string field = "tensor " + quoted(t.name);
        if (!names.insert(t.name).second) c.fail(field, t.info_offset, "duplicate tensor name");
        uint64_t dims_at = c.pos();
        uint32_t n_dims = c.read<uint32_t>(field + " n_dims");
        if (n_dims == 0 || n_dims > kMaxDims)
            c.fail(field + " n_dims", dims_at, std::to_string(n_dims) + " dimensions (must be 1.." + std::to_string(kMaxDims) + ")");
        t.n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            uint64_t at = c.pos();
            uint64_t dim = c.read<uint64_t>(field + " shape[" + std::to_string(d) + "]");
            if (dim == 0) c.fail(field + " shape", at, "dimension " + std::to_string(d) + " is zero");
            if (dim > (uint64_t{1} << 62) || mul_overflows(t.n_elements, dim, &t.n_elements) || t.n_elements > (uint64_t{1} << 62))
                c.fail(field + " shape", at, "element count overflows (dimension " + std::to_string(d) + " = " + std::to_string(dim) + ")");
            t.shape.push_back(dim);
        }
        uint64_t type_at = c.pos();
        uint32_t type_id = c.read<uint32_t>(field + " type");
        auto info = tensor_type_info(type_id);
        if (!info) c.fail(field + " type", type_at, "unknown tensor type id " + std::to_string(type_id));
        t.type = info->type;
        if (t.shape[0] % info->block_size != 0)
            c.fail(field + " shape", dims_at, "row length " + std::to_string(t.shape[0]) + " is not a multiple of " +
                                                 std::string(info->name) + "'s block size " + std::to_string(info->block_size));
        if (mul_overflows(t.n_elements / info->block_size, info->type_size, &t.n_bytes))
            c.fail(field + " shape", dims_at, "byte size overflows");
        uint64_t off_at = c.pos();
        t.offset = c.read<uint64_t>(field + " offset");
        if (t.offset % alignment_ != 0)
            c.fail(field + " offset", off_at, "data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                                                 std::to_string(alignment_));
        tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment after the tensor infos.
    uint64_t end_of_infos = c.pos();
    data_offset_ = (end_of_infos + alignment_ - 1) / alignment_ * alignment_;
    if (tensors_.empty()) {
        data_offset_ = std::min<uint64_t>(data_offset_, size_);
        return;
    }
    if (data_offset_ > size_)
        c.fail("data section", end_of_infos, "file ends before the data section starts at offset " + std::to_string(data_offset_));
    uint64_t data_size = size_ - data_offset_;

    std::vector<const GGUFTensorInfo*> by_offset;
    by_offset.reserve(tensors_.size());
    for (const auto& t : tensors_) {
        if (t.offset > data_size || t.n_bytes > data_size - t.offset)
            c.fail("tensor " + quoted(t.name) + " data", t.info_offset,
                   "data [" + std::to_string(data_offset_ + t.offset) + ", " + std::to_string(data_offset_ + t.offset) + " + " +
                       std::to_string(t.n_bytes) + ") runs past the end of the file (" + std::to_string(size_) + " bytes)");
        by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t k = 1; k < by_offset.size(); ++k) {
        const auto* prev = by_offset[k - 1];
        const auto* cur = by_offset[k];
        if (cur->offset < prev->offset + prev->n_bytes)
            c.fail("tensor " + quoted(cur->name) + " data", cur->info_offset,
                   "data overlaps tensor " + quoted(prev->name) + " (" + std::to_string(cur->offset) + " < " +
                       std::to_string(prev->offset) + " + " + std::to_string(prev->n_bytes) + ")");
    }
}

const GGUFValue* GGUFFile::find(std::string_view key) const {
    for (const auto& kv : metadata_)
        if (kv.key == key) return &kv.value;
    return nullptr;
}

const GGUFTensorInfo* GGUFFile::find_tensor(std::string_view name) const {
    for (const auto& t : tensors_)
        if (t.name == name) return &t;
    return nullptr;
}

namespace {
const GGUFKeyValue* find_kv(const std::vector<GGUFKeyValue>& md, std::string_view key) {
    for (const auto& kv : md)
        if (kv.key == key) return &kv;
    return nullptr;
}
// gguf-split's file name ending for shard `no` (1-based) of `count`: "-00002-of-00003.gguf".
std::string shard_suffix(uint64_t no, uint64_t count) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "-%05llu-of-%05llu.gguf", static_cast<unsigned long long>(no),
                  static_cast<unsigned long long>(count));
    return buf;
}
[[noreturn]] void wrong_type(const std::string& file, const GGUFKeyValue& kv, const char* wanted) {
    std::string field = "metadata '" + std::string(kv.key) + "'";
    throw GGUFError(file + ": " + field + " at offset " + std::to_string(kv.offset) + ": expected " + wanted + ", found " +
                        std::string(gguf_value_type_name(kv.value.type)),
                    field, kv.offset);
}
}  // namespace

void GGUFFile::join_split_shards() {
    const GGUFKeyValue* count_kv = find_kv(metadata_, "split.count");
    const uint64_t count = get_uint("split.count", 1);
    if (count <= 1) return;
    const uint64_t no = get_uint("split.no", 0);
    const uint64_t at = count_kv->offset;
    auto error = [&](const std::string& what) {
        return GGUFError(name_ + ": metadata 'split.count' at offset " + std::to_string(at) + ": " + what, "split.count", at);
    };
    const std::string n = std::to_string(count);
    if (count > 99999 || no >= count) throw error("shard " + std::to_string(no) + " of " + n + " is not a valid split");
    const std::string own = shard_suffix(no + 1, count);
    if (name_.size() < own.size() || name_.compare(name_.size() - own.size(), own.size(), own) != 0)
        throw error("this file is shard " + std::to_string(no + 1) + " of " + n + " of a split model, but its name does not end in '" +
                    own + "', so the other shards cannot be found; keep the names gguf-split gave the shards");
    const std::string prefix = name_.substr(0, name_.size() - own.size());
    if (no != 0)
        throw error("this file is shard " + std::to_string(no + 1) + " of " + n + " of a split model; open the first shard, " +
                    prefix + shard_suffix(1, count));

    std::vector<std::shared_ptr<const void>> mappings{mapping_};
    std::unordered_set<std::string_view> names;
    for (const auto& t : tensors_) names.insert(t.name);
    for (uint64_t i = 1; i < count; ++i) {
        const std::string path = prefix + shard_suffix(i + 1, count);
        GGUFFile shard;
        try {
            shard = open_file(path);
        } catch (const std::system_error& e) {
            throw error("shard " + std::to_string(i + 1) + " of " + n + " (" + path + ") cannot be opened (" + e.code().message() +
                        "); a split model needs all of its shards in one folder");
        }
        if (shard.get_uint("split.no", count) != i || shard.get_uint("split.count", 0) != count)
            throw error(path + " is not shard " + std::to_string(i + 1) + " of " + n + " (its split.no / split.count say otherwise)");
        for (GGUFTensorInfo t : shard.tensors_) {
            if (!names.insert(t.name).second)
                throw error("tensor " + quoted(t.name) + " appears in more than one shard (again in " + path + ")");
            t.shard = static_cast<uint32_t>(i);
            tensors_.push_back(std::move(t));
        }
        shards_.push_back(shard.shards_[0]);
        mappings.push_back(shard.mapping_);
    }
    if (find_kv(metadata_, "split.tensors.count")) {
        const uint64_t expected = get_uint("split.tensors.count", 0);
        if (expected != tensors_.size())
            throw error("the shards hold " + std::to_string(tensors_.size()) + " tensors but split.tensors.count says " +
                        std::to_string(expected));
    }
    mapping_ = std::make_shared<std::vector<std::shared_ptr<const void>>>(std::move(mappings));
}

uint64_t GGUFFile::get_uint(std::string_view key, uint64_t fallback) const {
    const GGUFKeyValue* kv = find_kv(metadata_, key);
    if (!kv) return fallback;
    const GGUFValue& v = kv->value;
    if (!v.is_integer()) wrong_type(name_, *kv, "an integer");
    bool is_signed = v.type == GGUFValueType::INT8 || v.type == GGUFValueType::INT16 || v.type == GGUFValueType::INT32 ||
                     v.type == GGUFValueType::INT64;
    if (is_signed && v.i < 0) wrong_type(name_, *kv, "a non-negative integer");
    return is_signed ? static_cast<uint64_t>(v.i) : v.u;
}

double GGUFFile::get_float(std::string_view key, double fallback) const {
    const GGUFKeyValue* kv = find_kv(metadata_, key);
    if (!kv) return fallback;
    const GGUFValue& v = kv->value;
    if (v.type == GGUFValueType::FLOAT32 || v.type == GGUFValueType::FLOAT64) return v.f;
    if (v.is_integer()) return v.u ? static_cast<double>(v.u) : static_cast<double>(v.i);
    wrong_type(name_, *kv, "a number");
}

std::string_view GGUFFile::get_string(std::string_view key, std::string_view fallback) const {
    const GGUFKeyValue* kv = find_kv(metadata_, key);
    if (!kv) return fallback;
    if (kv->value.type != GGUFValueType::STRING) wrong_type(name_, *kv, "a string");
    return kv->value.s;
}

}  // namespace edgerunner
