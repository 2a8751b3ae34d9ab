"""A self-signed certificate for the emulator's HTTPS port (tests only).

kubectl (client-go) sends a kubeconfig's credentials over TLS only: over plain HTTP it is
anonymous, as it would be against a real server. The emulator therefore also serves HTTPS, with
a certificate for 127.0.0.1 made here, for kubectl and other clients that need to authenticate.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import pathlib
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

LOCALHOST = ipaddress.ip_address("127.0.0.1")


def self_signed(directory: pathlib.Path) -> tuple[pathlib.Path, ssl.SSLContext]:
    """(the certificate's PEM file, a server context) for 127.0.0.1, valid for a day."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-emulator")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(LOCALHOST)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return cert_path, context
