"""Writes a small seed corpus for fuzz_gguf: valid files exercising every value type."""

import sys
from pathlib import Path

import gguf
import numpy as np

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for i, alignment in enumerate((32, 64)):
    w = gguf.GGUFWriter(str(out / f"seed{i}.gguf"), "llama")
    if alignment != 32:
        w.data_alignment = alignment
        w.add_custom_alignment(alignment)
    w.add_uint32("llama.block_count", 2)
    w.add_int8("k.i8", -1)
    w.add_float64("k.f64", 0.5)
    w.add_bool("k.bool", True)
    w.add_string("k.str", "héllo")
    w.add_array("k.strs", ["a", "bc"])
    w.add_array("k.nested", [[1, 2], [3]])
    w.add_array("k.floats", [0.5, 1.5])
    w.add_tensor("a", np.arange(8, dtype=np.float32))
    w.add_tensor("q", np.zeros((1, 18), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
