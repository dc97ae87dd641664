#!/usr/bin/env python3
"""The ECC MakeCredential vector of ek_ecc.rs's tests, computed apart from
the control plane's code (pyca/cryptography): the ephemeral scalar d is
all 7s, the AK name 000b 00 01 .. 1f, the credential 32 bytes of 9.
Prints the encrypted secret and the TPM2B_ID_OBJECT body, hex, per EK."""
import hashlib, hmac, struct
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

def kdfe(h, z, label, u, v, bits):
    out, c = b"", 1
    while len(out) * 8 < bits:
        out += hashlib.new(h, struct.pack(">I", c) + z + label + b"\0" + u + v).digest()
        c += 1
    return out[: bits // 8]

def kdfa(h, key, label, u, v, bits):
    out, c = b"", 1
    while len(out) * 8 < bits:
        msg = struct.pack(">I", c) + label + b"\0" + u + v + struct.pack(">I", bits)
        out += hmac.new(key, msg, h).digest()
        c += 1
    return out[: bits // 8]

AK_NAME = b"\x00\x0b" + bytes(range(32))
CREDENTIAL = bytes([9]) * 32
for cert, curve, h, n, sym_bits in [
    ("ek-p256-cert.der", ec.SECP256R1(), "sha256", 32, 128),
    ("ek-p384-cert.der", ec.SECP384R1(), "sha384", 48, 256),
]:
    ek = x509.load_der_x509_certificate(open(cert, "rb").read()).public_key()
    d = ec.derive_private_key(int.from_bytes(bytes([7]) * n, "big"), curve)
    z = d.exchange(ec.ECDH(), ek)
    q = d.public_key().public_numbers()
    qx, qy = q.x.to_bytes(n, "big"), q.y.to_bytes(n, "big")
    digest_bits = hashlib.new(h).digest_size * 8
    seed = kdfe(h, z, b"IDENTITY", qx, ek.public_numbers().x.to_bytes(n, "big"), digest_bits)
    secret = struct.pack(">H", n) + qx + struct.pack(">H", n) + qy
    sym_key = kdfa(h, seed, b"STORAGE", AK_NAME, b"", sym_bits)
    enc = Cipher(algorithms.AES(sym_key), modes.CFB(bytes(16))).encryptor()
    enc_identity = enc.update(struct.pack(">H", len(CREDENTIAL)) + CREDENTIAL) + enc.finalize()
    hmac_key = kdfa(h, seed, b"INTEGRITY", b"", b"", digest_bits)
    outer = hmac.new(hmac_key, enc_identity + AK_NAME, h).digest()
    id_object = struct.pack(">H", len(outer)) + outer + enc_identity
    print(cert, "secret", secret.hex())
    print(cert, "id_object", id_object.hex())
