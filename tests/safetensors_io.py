"""Reading and writing safetensors files (F32 and I64) for the PyTorch reference scripts,
without the safetensors package (Debian has none): a little-endian u64 header length,
the JSON header, then the tensors' bytes."""
import json
import struct

import numpy as np
import torch

# Floating tensors are written as F32 (a float64 reference's too), integers as I64.
_DTYPES = {torch.float32: ("F32", "<f4"), torch.float64: ("F32", "<f4"), torch.int64: ("I64", "<i8")}
_NUMPY = {"F32": "<f4", "I64": "<i8"}


def save_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, tensor in tensors.items():
        dtype, numpy_type = _DTYPES[tensor.dtype]
        blob = tensor.detach().contiguous().numpy().astype(numpy_type).tobytes()
        header[name] = {"dtype": dtype, "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = data[8 + length:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype=_NUMPY[entry["dtype"]]).reshape(entry["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors
