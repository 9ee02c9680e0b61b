"""Mutual TLS for the agent <-> controller link and tlctl over TCP.

The controller requires a client certificate signed by its CA; agents present one whose
common name is their host name. gRPC reports a handshake the peer refused as UNAVAILABLE
(the connection is simply closed), indistinguishable from a controller that is down, so
`diagnose` repeats the handshake with Python's ssl module to name the real cause: our
certificate refused (wrong CA, expired) or theirs not trusted. Callers then report
UNAUTHENTICATED with that reason.
"""

from __future__ import annotations

import functools
import socket
import ssl
from typing import Any

import grpc

from tensorlights.tls_files import ROLE_URI, Role, TlsFiles


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    ca, cert, key = tls.read("tls")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(tls: TlsFiles, what: str = "controller") -> grpc.ChannelCredentials:
    ca, cert, key = tls.read(what)
    return grpc.ssl_channel_credentials(ca, key, cert)


def channel_options(server_name: str | None) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = [
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def peer_common_name(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The common name of the client certificate the peer presented (None: no TLS)."""
    names = list(context.auth_context().get("x509_common_name") or [])
    return bytes(names[0]).decode(errors="replace") if names else None


def peer_roles(context: grpc.aio.ServicerContext[Any, Any]) -> frozenset[Role]:
    """The roles the client certificate carries (SAN URIs urn:tensorlights:role:...); none
    without TLS or without such a URI."""
    pems = list(context.auth_context().get("x509_pem_cert") or [])
    return _roles_in(bytes(pems[0])) if pems else frozenset()


@functools.lru_cache(maxsize=16384)
def _roles_in(pem: bytes) -> frozenset[Role]:
    """Parsed once per certificate: every agent report asks (one certificate per agent)."""
    from cryptography import x509  # the controller's alone: agents do not load it (~20 MiB)

    certificate = x509.load_pem_x509_certificate(pem)
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return frozenset()
    known = {role.value for role in Role}
    return frozenset(
        Role(uri.removeprefix(ROLE_URI))
        for uri in names.value.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(ROLE_URI) and uri.removeprefix(ROLE_URI) in known
    )


def diagnose(address: str, tls: TlsFiles, server_name: str | None, timeout_s: float = 3.0) -> str:
    """Why a TLS connection to `address` fails, in one line; "" when it succeeds (or the
    cause is not TLS: the caller's own error then stands)."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_verify_locations(str(tls.ca))
        context.load_cert_chain(str(tls.cert), str(tls.key))
    except (OSError, ssl.SSLError) as exc:
        return f"our TLS files cannot be loaded: {exc}"
    context.set_alpn_protocols(["h2"])
    context.check_hostname = server_name is not None or not _is_ip(host.strip("[]"))
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=server_name or host.strip("[]")) as tls_sock,
        ):
            # TLS 1.3: the server checks our certificate after the handshake and, refusing
            # it, closes the connection instead of sending its HTTP/2 settings.
            tls_sock.settimeout(timeout_s)
            if tls_sock.recv(1) == b"":
                return (
                    "the controller closed the connection after the TLS handshake: it refused "
                    "our client certificate (signed by another CA, expired or not yet valid?)"
                )
            return ""
    except ssl.SSLCertVerificationError as exc:
        return f"the controller's certificate is not trusted: {exc.verify_message}"
    except ssl.SSLError as exc:
        return f"TLS handshake failed: {exc.reason or exc}"
    except OSError:
        return ""


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return False
    return True
