"""What the end-to-end tier does in cert-manager's place, which cannot run here: the module proxy serves
cert-manager's main module (its chart, its CRDs, its libraries) but none of the modules its programs'
main packages live in (cmd/controller, cmd/webhook, cmd/cainjector: each its own go.mod, never
published; checked 2026-11-29). So the tier plays the cluster's own cert-manager, as a cluster that
already runs one would (the stack's `platform.installCertManager: false`):

- its CRDs, from the module at the stacks' pinned version (deploy/crds);
- the two parts of its behaviour KServe's chart relies on, restated from cert-manager v1.21.2:
  a self-signed Issuer issues a Certificate's key pair into its secret (pkg/issuer/selfsigned: the
  certificate signs itself, and is its own ca.crt), and cainjector copies a CA into the objects that
  ask for it by annotation (pkg/controller/cainjector: `cert-manager.io/inject-ca-from: <ns>/<certificate>`
  or `...-from-secret: <ns>/<secret>`, into each webhook's clientConfig.caBundle, a CRD's conversion
  webhook and an APIService's spec.caBundle).

Any other issuer is refused on the Certificate's Ready condition, naming this module: the stand-in
does no more than it says.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tools.control_plane.kube import Api
from tools.control_plane.upstream import load_all

CERT_MANAGER = "cert-manager.io/v1"
CRDS = Path("deploy", "crds")
INJECT_FROM = "cert-manager.io/inject-ca-from"
INJECT_FROM_SECRET = "cert-manager.io/inject-ca-from-secret"
CA_TARGETS = (
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
    ("apiregistration.k8s.io/v1", "APIService"),
)
VALIDITY = datetime.timedelta(days=90)  # cert-manager's default duration
POLL_SECONDS = 1.0


def crds(module_dir: Path) -> list[dict]:
    """cert-manager's CRDs as its module holds them at the pinned version."""
    return [crd for path in sorted((module_dir / CRDS).glob("*.yaml")) for crd in load_all(path.read_text())]


def self_signed(certificate: dict) -> tuple[bytes, bytes]:
    """(certificate, key) PEM of a Certificate issued by a self-signed issuer: its names, its CA flag."""
    spec = certificate["spec"]
    key = ec.generate_private_key(ec.SECP256R1())
    common_name = spec.get("commonName") or (spec.get("dnsNames") or [certificate["metadata"]["name"]])[0]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + VALIDITY)
               .add_extension(x509.BasicConstraints(ca=bool(spec.get("isCA")), path_length=None),
                              critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                     ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if spec.get("dnsNames"):
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in spec["dnsNames"]]), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def ready(status: str, reason: str, message: str) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
                                       "message": message, "lastTransitionTime": now}]}}


def with_ca_bundle(obj: dict, ca: str) -> dict | None:
    """The merge patch that gives `obj` the CA bundle `ca` (base64) where cainjector writes it; None
    when it already has it."""
    kind = obj["kind"]
    if kind.endswith("WebhookConfiguration"):
        webhooks = obj.get("webhooks") or []
        if all((webhook.get("clientConfig") or {}).get("caBundle") == ca for webhook in webhooks):
            return None
        return {"webhooks": [{**webhook, "clientConfig": {**webhook.get("clientConfig", {}), "caBundle": ca}}
                             for webhook in webhooks]}
    if kind == "APIService":
        return None if obj["spec"].get("caBundle") == ca else {"spec": {"caBundle": ca}}
    webhook = ((obj["spec"].get("conversion") or {}).get("webhook") or {})
    if not webhook or (webhook.get("clientConfig") or {}).get("caBundle") == ca:
        return None
    return {"spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": ca}}}}}


@dataclasses.dataclass
class StandIn:
    """Issues self-signed Certificates and injects CAs, once a second, until stopped."""

    api: Api
    say: callable = print
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    errors: list[str] = dataclasses.field(default_factory=list)

    def start(self) -> StandIn:
        self._thread = threading.Thread(target=self._run, name="cert-manager stand-in", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.issue()
                self.inject()
            except Exception as error:  # noqa: BLE001 - a CRD or object gone mid-read: the next round sees
                self.errors.append(str(error))

    def issuer(self, certificate: dict) -> dict | None:
        reference = certificate["spec"]["issuerRef"]
        kind = reference.get("kind", "Issuer")
        namespace = certificate["metadata"]["namespace"] if kind == "Issuer" else None
        return self.api.get(CERT_MANAGER, kind, reference["name"], namespace)

    def issue(self) -> None:
        for issuer in [*self.api.list(CERT_MANAGER, "Issuer"), *self.api.list(CERT_MANAGER, "ClusterIssuer")]:
            if "selfSigned" in issuer["spec"] and not (issuer.get("status") or {}).get("conditions"):
                self.api.patch(CERT_MANAGER, issuer["kind"], issuer["metadata"]["name"],
                               ready("True", "IsReady", "self-signed (the tier's stand-in for cert-manager)"),
                               issuer["metadata"].get("namespace"), subresource="status")
        for certificate in self.api.list(CERT_MANAGER, "Certificate"):
            metadata, spec = certificate["metadata"], certificate["spec"]
            if self.api.get("v1", "Secret", spec["secretName"], metadata["namespace"]):
                continue
            issuer = self.issuer(certificate)
            if issuer is None or "selfSigned" not in issuer["spec"]:
                self.api.patch(CERT_MANAGER, "Certificate", metadata["name"], ready(
                    "False", "Pending", "the tier's stand-in for cert-manager "
                    "(tools/control_plane/cert_manager.py) issues from self-signed issuers only"),
                    metadata["namespace"], subresource="status")
                continue
            cert, key = self_signed(certificate)
            encoded = {name: base64.b64encode(value).decode() for name, value in
                       (("tls.crt", cert), ("tls.key", key), ("ca.crt", cert))}
            annotations = {"cert-manager.io/certificate-name": metadata["name"]}
            self.api.create({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                             "metadata": {"name": spec["secretName"], "namespace": metadata["namespace"],
                                          "annotations": annotations},
                             "data": encoded})
            self.api.patch(CERT_MANAGER, "Certificate", metadata["name"], ready("True", "Ready", "issued"),
                           metadata["namespace"], subresource="status")
            self.say(f"cert-manager stand-in: issued {metadata['namespace']}/{metadata['name']} into secret "
                     f"{spec['secretName']}")

    def ca_of(self, annotations: dict) -> str | None:
        if INJECT_FROM in annotations:
            namespace, _, name = annotations[INJECT_FROM].partition("/")
            certificate = self.api.get(CERT_MANAGER, "Certificate", name, namespace)
            secret_name = certificate and certificate["spec"]["secretName"]
        elif INJECT_FROM_SECRET in annotations:
            namespace, _, secret_name = annotations[INJECT_FROM_SECRET].partition("/")
        else:
            return None
        secret = secret_name and self.api.get("v1", "Secret", secret_name, namespace)
        return secret and (secret.get("data") or {}).get("ca.crt")

    def inject(self) -> None:
        for api_version, kind in CA_TARGETS:
            for obj in self.api.list(api_version, kind):
                ca = self.ca_of(obj["metadata"].get("annotations") or {})
                patch = ca and with_ca_bundle(obj, ca)
                if patch:
                    self.api.patch(api_version, kind, obj["metadata"]["name"], patch)
                    self.say(f"cert-manager stand-in: injected its CA into {kind} {obj['metadata']['name']}")
