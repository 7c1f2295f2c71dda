#!/usr/bin/env python3
"""Writes a GGUF file with random blocks of every quantized type the C runtime reads, each next
to its dequantization by the `gguf` package (tensor "<TYPE>.ref", F32), for test_gw_quant.
Usage: gen_quant_ref.py OUT.gguf"""
import sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# byte offsets of the fp16 scale fields inside one block: random bytes there could be NaN/inf
F16_FIELDS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0], T.Q2_K: [80, 82],
              T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def main():
    rng = np.random.default_rng(1234)
    w = GGUFWriter(sys.argv[1], "quantref")
    rows = 3
    for qt, offs in F16_FIELDS.items():
        block, nbytes = GGML_QUANT_SIZES[qt]
        blocks_per_row = 2
        raw = rng.integers(0, 256, size=(rows, blocks_per_row, nbytes), dtype=np.uint8)
        for o in offs:
            scale = rng.uniform(-0.05, 0.05, size=(rows, blocks_per_row)).astype(np.float16)
            raw[:, :, o:o + 2] = scale.view(np.uint8).reshape(rows, blocks_per_row, 2)
        raw = raw.reshape(rows, blocks_per_row * nbytes)
        w.add_tensor(qt.name, raw, raw_dtype=qt)
        w.add_tensor(qt.name + ".ref", np.asarray(dequantize(raw, qt), dtype=np.float32))
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    w.add_tensor("F16", x.astype(np.float16), raw_dtype=T.F16)
    w.add_tensor("F16.ref", x.astype(np.float16).astype(np.float32))
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor("BF16", bf.view(np.uint8).reshape(rows, 128), raw_dtype=T.BF16)
    w.add_tensor("BF16.ref", np.asarray(dequantize(bf.view(np.uint8).reshape(rows, 128), T.BF16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
