"""Reading the weights a job writes (output.weights): safetensors files, read here
without the safetensors package (Debian ships none).

    import paramserver
    model = MyNet()
    paramserver.load_state_dict(model, "weights.safetensors")  # strict, as torch's
"""

import json
import struct

import torch

__all__ = ["load_file", "load_state_dict"]

# safetensors' dtype names and their torch dtypes and sizes in bytes.
_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}


def load_file(path):
    """The tensors of the safetensors file at `path`, as {name: tensor} on the CPU in the
    file's order, as safetensors.torch.load_file returns them. ValueError naming the file
    and what is wrong for a short file, a bad header, an unknown dtype, or a tensor whose
    offsets disagree with its shape or leave the data."""
    with open(path, "rb") as handle:
        data = handle.read()

    def bad(why):
        return ValueError("%s: not a safetensors file: %s" % (path, why))

    if len(data) < 8:
        raise bad("%d bytes, shorter than the header's length" % len(data))
    (header_length,) = struct.unpack("<Q", data[:8])
    if header_length > len(data) - 8:
        raise bad("its header's length %d runs past the file's end" % header_length)
    try:
        header = json.loads(data[8:8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise bad("its header is not JSON: %s" % error) from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    body = memoryview(data)[8 + header_length:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, size = _DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as error:
            raise bad("tensor '%s' has a bad entry %r (%s)" % (name, entry, error)) from None
        count = 1
        for d in shape:
            if d < 0:
                raise bad("tensor '%s' has shape %s" % (name, shape))
            count *= d
        if not 0 <= begin <= end <= len(body) or end - begin != count * size:
            raise bad("tensor '%s' (%s %s) has data_offsets [%d, %d] in %d bytes of data" %
                      (name, entry["dtype"], shape, begin, end, len(body)))
        raw = bytearray(body[begin:end])  # a writable copy: torch.frombuffer shares it
        flat = (torch.frombuffer(raw, dtype=dtype) if count > 0
                else torch.empty(0, dtype=dtype))
        tensors[name] = flat.reshape(shape)
    return tensors


def load_state_dict(model, path, strict=True):
    """Loads the weights file at `path` (a job's output.weights) into `model` with ``model.load_state_dict(..., strict)`` and
    returns what that returns. Parameters and buffers load as torch's own state_dict
    would (num_batches_tracked is stored as I64). The rows of the job's
    :class:`paramserver.Embedding` tables (``<table>.ids`` and ``<table>.weight``, which no
    module holds) are left out; :func:`load_file` reads them."""
    tensors = load_file(path)
    wanted = model.state_dict()
    for name in [n for n in tensors if n.endswith(".ids")]:
        table = name[:-len(".ids")]
        if name not in wanted and table + ".weight" not in wanted:
            tensors.pop(name)
            tensors.pop(table + ".weight", None)
    return model.load_state_dict(tensors, strict=strict)
