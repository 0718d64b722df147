#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for worker/tensorboard_writer_test.

Checks every TFRecord's framing and both masked CRC-32C values (computed here bit by
bit, not with the C++ table), decodes the Event protos' wire format by hand, and prints
one line per event: "version <file_version>" or "scalar <tag> <step> <value>".
Exits 1 naming the first bad record.
"""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, pos):
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(buf):
    """(field number, wire type, value) of each field of a message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError("wire type %d" % wire)
        yield number, wire, value


def main(path):
    data = open(path, "rb").read()
    pos, index = 0, 0
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if length_crc != masked(header):
            sys.exit("record %d: bad length CRC" % index)
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(body) != length or body_crc != masked(body):
            sys.exit("record %d: bad data CRC" % index)
        pos += 16 + length
        index += 1
        step, wall_time = 0, None
        for number, wire, value in fields(body):
            if number == 1 and wire == 1:
                (wall_time,) = struct.unpack("<d", value)
            elif number == 2 and wire == 0:
                step = value
            elif number == 3:
                print("version %s" % value.decode())
            elif number == 5:
                for n, _, summary_value in fields(value):
                    if n != 1:
                        continue
                    tag, simple = None, None
                    for vn, vw, vv in fields(summary_value):
                        if vn == 1:
                            tag = vv.decode()
                        elif vn == 2 and vw == 5:
                            (simple,) = struct.unpack("<f", vv)
                    print("scalar %s %d %.6g" % (tag, step, simple))
        if wall_time is None or wall_time < 1.6e9:
            sys.exit("record %d: no plausible wall_time" % index)


if __name__ == "__main__":
    main(sys.argv[1])
