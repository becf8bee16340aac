"""The tier's certificates, made when it starts: one CA; the API server's serving certificate; the
admin's client certificate (group system:masters, as kubeadm's admin.conf); the API server's
front-proxy client certificate, with which its aggregation layer calls an aggregated API server
(KEDA's metrics adapter), as kubeadm's front-proxy-client; one serving certificate for every webhook
and gRPC server of the controllers (they answer on 127.0.0.1); and the key that signs service-account
tokens. Nothing leaves the tier's directory.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.cluster_names import CLUSTER_DOMAIN

VALIDITY = datetime.timedelta(days=2)  # a test session's
FRONT_PROXY_NAME = "front-proxy-client"  # kubeadm's: the API server's --requestheader-allowed-names
LOOPBACK = ipaddress.ip_address("127.0.0.1")
CLIENT = (ExtendedKeyUsageOID.CLIENT_AUTH,)
# The names a client may use for the API server: from this network namespace and, as a pod, the
# default namespace's `kubernetes` Service.
API_SERVER_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
)


@dataclasses.dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclasses.dataclass(frozen=True)
class Pki:
    ca: KeyPair
    api_server: KeyPair
    admin: KeyPair
    front_proxy: KeyPair  # the aggregation layer's client certificate (FRONT_PROXY_NAME)
    serving: KeyPair  # every controller's webhook and gRPC servers
    service_account_key: Path  # signs tokens (its public half verifies them)
    service_account_public: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert.read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _certificate(
    subject: x509.Name,
    public_key,
    issuer: x509.Name,
    signing_key,
    *,
    ca: bool = False,
    dns: tuple[str, ...] = (),
    ips: tuple = (),
    usages: tuple = (ExtendedKeyUsageOID.SERVER_AUTH,),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if dns or ips:
        names = [x509.DNSName(name) for name in dns] + [x509.IPAddress(ip) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _issue(directory: Path, name: str, ca_key, ca_name: x509.Name, subject: x509.Name, **kwargs) -> KeyPair:
    key = _key()
    cert = _certificate(subject, key.public_key(), ca_name, ca_key, **kwargs)
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, pair.key)
    return pair


def make(directory: Path, api_server_addresses: tuple[str, ...] = ()) -> Pki:
    """The tier's certificates; the API server's names loopback and `api_server_addresses` too (where
    pods reach it: cluster.API_SERVER_ADDRESSES)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _key(), _name("dist-ml control-plane tier CA")
    ca_cert = _certificate(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True)
    ca = KeyPair(directory / "ca.crt", directory / "ca.key")
    ca.cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(ca_key, ca.key)
    api_server = _issue(
        directory,
        "apiserver",
        ca_key,
        ca_name,
        _name("kube-apiserver"),
        dns=API_SERVER_NAMES,
        ips=(LOOPBACK, *(ipaddress.ip_address(address) for address in api_server_addresses)),
    )
    admin = _issue(directory, "admin", ca_key, ca_name, _name("tier-admin", "system:masters"), usages=CLIENT)
    front_proxy = _issue(directory, FRONT_PROXY_NAME, ca_key, ca_name, _name(FRONT_PROXY_NAME), usages=CLIENT)
    serving = _issue(
        directory, "serving", ca_key, ca_name, _name("controllers"), dns=("localhost",), ips=(LOOPBACK,)
    )
    # Service-account tokens are RS256 (RSA), the algorithm every Kubernetes client verifies.
    signer = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    service_account_key = directory / "sa.key"
    _write_key(signer, service_account_key)
    service_account_public = directory / "sa.pub"
    service_account_public.write_bytes(
        signer.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(ca, api_server, admin, front_proxy, serving, service_account_key, service_account_public)


def _ca(pki: Pki):
    key = serialization.load_pem_private_key(pki.ca.key.read_bytes(), password=None)
    return key, x509.load_pem_x509_certificate(pki.ca_pem).subject


def issue_client(pki: Pki, directory: Path, name: str, common_name: str, organization: str | None) -> KeyPair:
    """A client certificate of the tier's CA: user `common_name`, group `organization`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _ca(pki)
    return _issue(directory, name, ca_key, ca_name, _name(common_name, organization), usages=CLIENT)


def issue_serving(
    pki: Pki, directory: Path, name: str, addresses: tuple[str, ...], dns: tuple[str, ...] = (),
    client: bool = False,
) -> KeyPair:
    """A serving certificate of the tier's CA for `addresses` and `dns` names (the kubelet's, which the
    API server calls; an aggregated API server's, by its Service's name), a client's too if `client`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = _ca(pki)
    ips = tuple(ipaddress.ip_address(address) for address in addresses)
    usages = (ExtendedKeyUsageOID.SERVER_AUTH, *CLIENT) if client else (ExtendedKeyUsageOID.SERVER_AUTH,)
    return _issue(directory, name, ca_key, ca_name, _name(name), ips=ips, dns=dns, usages=usages)
