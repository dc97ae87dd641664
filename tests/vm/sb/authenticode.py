#!/usr/bin/env python3
"""The Authenticode SHA-256 of PE images (the digest UEFI firmware and shim
measure into PCR 4 for a boot application), computed here, on the host, from
the files scripts/sbtest puts on the ESP: independently of bcd's event log
parsing, so that the policy the test writes is not read back from the log it
judges. Standard library only (no pefile on a fresh Debian 12).

Usage: authenticode.py FILE...   prints "HEX  FILE" per file.
"""
import hashlib
import struct
import sys


def authenticode_sha256(data: bytes) -> str:
    if data[:2] != b"MZ":
        raise ValueError("not a PE image (no MZ header)")
    pe = struct.unpack_from("<I", data, 0x3C)[0]
    if data[pe:pe + 4] != b"PE\0\0":
        raise ValueError("not a PE image (no PE signature)")
    coff = pe + 4
    nsections, = struct.unpack_from("<H", data, coff + 2)
    opt_size, = struct.unpack_from("<H", data, coff + 16)
    opt = coff + 20
    magic, = struct.unpack_from("<H", data, opt)
    if magic == 0x20B:  # PE32+
        dirs = opt + 112
    elif magic == 0x10B:  # PE32
        dirs = opt + 96
    else:
        raise ValueError(f"unknown optional header magic {magic:#x}")
    checksum = opt + 64
    cert_dir = dirs + 4 * 8  # IMAGE_DIRECTORY_ENTRY_SECURITY
    size_of_headers, = struct.unpack_from("<I", data, opt + 60)
    cert_off, cert_size = struct.unpack_from("<II", data, cert_dir)
    h = hashlib.sha256()
    # The headers, less the checksum and the certificate table's entry.
    h.update(data[:checksum])
    h.update(data[checksum + 4:cert_dir])
    h.update(data[cert_dir + 8:size_of_headers])
    # The sections in file order, then what follows them, less the
    # certificate table (PE/COFF spec, "Calculating the PE Image Hash").
    sec = opt + opt_size
    sections = []
    for i in range(nsections):
        raw_size, raw_ptr = struct.unpack_from("<II", data, sec + 40 * i + 16)
        if raw_size:
            sections.append((raw_ptr, raw_size))
    hashed = size_of_headers
    for ptr, size in sorted(sections):
        h.update(data[ptr:ptr + size])
        hashed = max(hashed, ptr + size)
    end = len(data) - cert_size if cert_size and cert_off + cert_size == len(data) else len(data)
    if cert_size and cert_off + cert_size != len(data):
        end = cert_off if cert_off >= hashed else len(data)
    if end > hashed:
        h.update(data[hashed:end])
    return h.hexdigest()


def main() -> int:
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            print(f"{authenticode_sha256(f.read())}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
