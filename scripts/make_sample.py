#!/usr/bin/env python3
"""Writes tests/data/tiny_l1.safetensors, the real sample twellc embeds: layer 1 of
../shared/data/tiny_l01.safetensors (model "tiny", d_model 512, d_ff 1408; gate/up/down weights and x
for 1024 held-out tokens), tensors copied byte for byte. Standard library only."""
import json, struct, sys

src = sys.argv[1] if len(sys.argv) > 1 else "../shared/data/tiny_l01.safetensors"
dst = sys.argv[2] if len(sys.argv) > 2 else "tests/data/tiny_l1.safetensors"
raw = open(src, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
out_header, blobs, offset = {"__metadata__": dict(header.get("__metadata__", {}), source=src.split("/")[-1] + ", layer 1")}, [], 0
for name in sorted(k for k in header if k.startswith("layers.1.")):
    t = header[name]
    b, e = t["data_offsets"]
    out_header[name] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [offset, offset + e - b]}
    blobs.append(data[b:e])
    offset += e - b
h = json.dumps(out_header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(dst, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(f"wrote {dst}: {', '.join(n for n in out_header if n != '__metadata__')}")
