// Python view of the GGUF reader: metadata as Python values, numeric arrays and tensor data as
// read-only numpy arrays over the mapping (no copies).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <cstring>
#include <system_error>

#include "edgerunner/gguf.h"

namespace nb = nanobind;
using namespace edgerunner;

namespace {

// Messages may quote file content; never let a stray byte turn the error into another error.
nb::object message_str(const std::string& s) {
    return nb::steal(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

// A read-only numpy array over bytes of the mapping; the array keeps the mapping alive.
template <typename T>
nb::object view(const GGUFFile& f, const uint8_t* p, size_t count) {
    auto* keep = new std::shared_ptr<const void>(f.mapping());
    nb::capsule owner(keep, [](void* k) noexcept { delete static_cast<std::shared_ptr<const void>*>(k); });
    size_t shape[1] = {count};
    // Packed metadata arrays may be unaligned; numpy copes, a typed view is still correct.
    nb::ndarray<nb::numpy, const T, nb::ndim<1>> arr(reinterpret_cast<const T*>(p), 1, shape, owner);
    return nb::cast(arr);
}

nb::object numeric_array(const GGUFFile& f, const GGUFValue& v) {
    switch (v.elem_type) {
        case GGUFValueType::UINT8: return view<uint8_t>(f, v.raw, v.count);
        case GGUFValueType::INT8: return view<int8_t>(f, v.raw, v.count);
        case GGUFValueType::UINT16: return view<uint16_t>(f, v.raw, v.count);
        case GGUFValueType::INT16: return view<int16_t>(f, v.raw, v.count);
        case GGUFValueType::UINT32: return view<uint32_t>(f, v.raw, v.count);
        case GGUFValueType::INT32: return view<int32_t>(f, v.raw, v.count);
        case GGUFValueType::UINT64: return view<uint64_t>(f, v.raw, v.count);
        case GGUFValueType::INT64: return view<int64_t>(f, v.raw, v.count);
        case GGUFValueType::FLOAT32: return view<float>(f, v.raw, v.count);
        case GGUFValueType::FLOAT64: return view<double>(f, v.raw, v.count);
        case GGUFValueType::BOOL: return view<bool>(f, v.raw, v.count);
        default: return nb::none();
    }
}

nb::object to_python(const GGUFFile& f, const GGUFValue& v) {
    switch (v.type) {
        case GGUFValueType::UINT8: case GGUFValueType::UINT16: case GGUFValueType::UINT32: case GGUFValueType::UINT64:
            return nb::int_(v.u);
        case GGUFValueType::INT8: case GGUFValueType::INT16: case GGUFValueType::INT32: case GGUFValueType::INT64:
            return nb::int_(v.i);
        case GGUFValueType::FLOAT32: case GGUFValueType::FLOAT64: return nb::float_(v.f);
        case GGUFValueType::BOOL: return nb::bool_(v.u != 0);
        case GGUFValueType::STRING: return nb::str(v.s.data(), v.s.size());
        case GGUFValueType::ARRAY: {
            if (v.elem_type == GGUFValueType::STRING) {
                nb::list out;
                for (auto s : v.strings) out.append(nb::str(s.data(), s.size()));
                return out;
            }
            if (v.elem_type == GGUFValueType::ARRAY) {
                nb::list out;
                for (const auto& a : v.arrays) out.append(to_python(f, a));
                return out;
            }
            return numeric_array(f, v);
        }
    }
    return nb::none();
}

nb::object value_type(const GGUFValue& v) {
    std::string t(gguf_value_type_name(v.type));
    if (v.type != GGUFValueType::ARRAY) return nb::str(t.c_str());
    return nb::make_tuple(t, gguf_value_type_name(v.elem_type));
}

}  // namespace

void bind_gguf(nb::module_& m) {
    // edgerunner.errors.GGUFError(message, field, offset) is raised for every malformed file.
    nb::register_exception_translator([](const std::exception_ptr& p, void*) {
        try {
            std::rethrow_exception(p);
        } catch (const GGUFError& e) {
            nb::object cls = nb::module_::import_("edgerunner.errors").attr("GGUFError");
            PyErr_SetObject(cls.ptr(), nb::make_tuple(message_str(e.what()), message_str(e.field()), e.offset()).ptr());
        } catch (const std::system_error& e) {
            PyErr_SetObject(PyExc_OSError, nb::make_tuple(e.code().value(), message_str(e.what())).ptr());
        }
    });

    nb::class_<GGUFFile>(m, "GGUFFile", "A memory-mapped, validated GGUF file")
        .def_static("open", &GGUFFile::open, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>(),
                    "Map and validate a GGUF file; raises GGUFError when it is malformed.")
        .def_prop_ro("path", &GGUFFile::path)
        .def_prop_ro("version", &GGUFFile::version)
        .def_prop_ro("alignment", &GGUFFile::alignment)
        .def_prop_ro("data_offset", &GGUFFile::data_offset)
        .def_prop_ro("file_size", &GGUFFile::file_size)
        .def_prop_ro("shards", [](const GGUFFile& f) {
            nb::list out;
            for (const auto& s : f.shards()) out.append(nb::make_tuple(s.path, s.size));
            return out;
        }, "(path, size) of every mapped file: one for an ordinary file, each shard of a split model.")
        .def("metadata", [](const GGUFFile& f) {
            nb::dict d;
            for (const auto& kv : f.metadata()) d[nb::str(kv.key.data(), kv.key.size())] = to_python(f, kv.value);
            return d;
        }, "All key-value pairs in file order; numeric arrays are read-only numpy views.")
        .def("metadata_types", [](const GGUFFile& f) {
            nb::dict d;
            for (const auto& kv : f.metadata()) d[nb::str(kv.key.data(), kv.key.size())] = value_type(kv.value);
            return d;
        }, "Each key's GGUF value type: a name, or (ARRAY, element type name).")
        .def("tensors", [](const GGUFFile& f) {
            nb::list out;
            for (const auto& t : f.tensors()) {
                nb::list shape;
                for (auto d : t.shape) shape.append(d);
                out.append(nb::make_tuple(nb::str(t.name.data(), t.name.size()), nb::tuple(shape),
                                          static_cast<uint32_t>(t.type), t.offset, t.n_bytes, t.n_elements));
            }
            return out;
        }, "Tensor infos as (name, shape, type id, data offset, n_bytes, n_elements), GGUF order.")
        .def("tensor_data", [](const GGUFFile& f, std::string_view name) {
            const GGUFTensorInfo* t = f.find_tensor(name);
            if (!t) throw nb::key_error(("no tensor named '" + std::string(name) + "' in " + f.path()).c_str());
            return view<uint8_t>(f, f.tensor_data(*t), t->n_bytes);
        }, nb::arg("name"), "The tensor's raw bytes as a read-only uint8 numpy view over the mapping.");

    m.def("tensor_type_info", [](uint32_t id) -> nb::object {
        auto info = tensor_type_info(id);
        if (!info) return nb::none();
        return nb::make_tuple(std::string(info->name), info->block_size, info->type_size, info->dequantize);
    }, nb::arg("type_id"), "(name, block_size, type_size, dequantizable) for a ggml type id, or None.");
    m.def("tensor_type_names", []() {
        nb::dict d;
        for (uint32_t id = 0; id < 64; ++id)
            if (auto info = tensor_type_info(id)) d[nb::str(info->name.data(), info->name.size())] = id;
        return d;
    }, "Every known ggml type name mapped to its id.");
}
