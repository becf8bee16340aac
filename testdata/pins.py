"""Every file the tests need that the repository does not carry, pinned: upstream CRDs by URL at a
fixed commit with the SHA-256 of their bytes, and the SHA-256 of the in-repo Fashion-MNIST sample.

CI caches the downloads keyed on this file's hash: change a pin here and the cache starts afresh.
The checksums were computed from the byte-for-byte upstream copies in ../shared/schemas, whose git
blob SHAs match the upstream ones named in its README. ../shared does not carry the CRDs of the Gateway
API, Kubeflow Trainer v2, JobSet and Kueue, so the repository does (testdata/upstream/<project>-<tag>/,
the upstream files byte for byte from the tag's tree, Apache-2.0 like their projects: Gateway API git
blob 7d5b5811d140950b1849a6ae324691887da50a65 for gateways, 8c272c5d00145e6989320d1180d493d81dfb472a for
httproutes); they are checked against the same pins as a download would be.
"""

from __future__ import annotations

from dataclasses import dataclass

RAW = "https://raw.githubusercontent.com"

# Upstream commits of the tags the stacks install (Pulumi.*.yaml, platform versions).
TRAINING_OPERATOR_V1_9_4 = f"{RAW}/kubeflow/trainer/4445c12aa62e4345b0c2c6ac9b215a70eca46ed7"
ARGO_V3_7_18 = f"{RAW}/argoproj/argo-workflows/66e32e5cc367f223e2ecf4fbe852b95eaed83034"
ARGO_V4_1_2 = f"{RAW}/argoproj/argo-workflows/16a52d67daf2f4a8a76fa8bec02a76a46aa46257"
KSERVE_V0_20_0 = f"{RAW}/kserve/kserve/1fb781055dd1567164358233e1125142ca6ef1fe"
# Gateway API v1.2.1, the standard channel: the CRDs k3s v1.33's packaged Traefik chart (34.x)
# installed, and the v1 kinds GKE's standard channel serves. k3s v1.35.8's chart (40.1) installs v1.5.1,
# whose v1 Gateway and HTTPRoute accept every field v1.2.1's do.
GATEWAY_API_V1_2_1 = f"{RAW}/kubernetes-sigs/gateway-api/a8fe5c8732a37ef471d86afaf570ff8ad0ef0221"
GATEWAY_API_CRDS = "config/crd/standard"
GATEWAY_API_DIR = "gateway-api-v1.2.1"
# Kubeflow Trainer v2 (TrainJob, ClusterTrainingRuntime), the JobSet its TrainJobs become, and Kueue
# (kueue.x-k8s.io/v1beta2): the releases the stacks install (stacks/settings.py PlatformConfig).
TRAINER_V2_3_0 = f"{RAW}/kubeflow/trainer/658725bdae5c7e3a0854d93ac6ff492e109a22ab"
JOBSET_V0_12_0 = f"{RAW}/kubernetes-sigs/jobset/f22e565ac3cc3265c7c45ef67ecffdc689af5d77"
KUEUE_V0_19_2 = f"{RAW}/kubernetes-sigs/kueue/8eab68778fc1b52affe165fdf5af29d1e9b4f3cb"
TRAINER_DIR, JOBSET_DIR, KUEUE_DIR = "trainer-v2.3.0", "jobset-v0.12.0", "kueue-v0.19.2"
# The "full" Argo CRDs (with openAPIV3 schemas); a default v3 install uses the schema-less minimal ones.
ARGO_FULL_CRDS = "manifests/base/crds/full"


@dataclass(frozen=True)
class Pin:
    """One upstream file: `name` is its path under ../shared/schemas and under the cache, the name the
    tests ask for."""

    name: str
    url: str
    sha256: str
    size: int  # bytes: a download that grows past it is cut short as a mismatch


CRD_PINS: dict[str, Pin] = {pin.name: pin for pin in (
    Pin("kubeflow.org_tfjobs.yaml",
        f"{TRAINING_OPERATOR_V1_9_4}/manifests/base/crds/kubeflow.org_tfjobs.yaml",
        "6028ab677922ee558d279c9cc2028500372875eec327ed6819fc4dc2796cda9e", 611_577),
    Pin("argoproj.io_workflows.yaml",
        f"{ARGO_V3_7_18}/{ARGO_FULL_CRDS}/argoproj.io_workflows.yaml",
        "ccbc7d66bcde1a5be0985630e13561f982800c47a8486d9ccb3dde6e7ddac068", 3_218_769),
    Pin("argoproj.io_workflowtemplates.yaml",
        f"{ARGO_V3_7_18}/{ARGO_FULL_CRDS}/argoproj.io_workflowtemplates.yaml",
        "b52ca3ef1a6757202e51a567c2788adda51af8f5bf7fcf7f2ac1b3560f97ecb2", 1_215_121),
    Pin("argo-v4.1.2/argoproj.io_workflows.yaml",
        f"{ARGO_V4_1_2}/{ARGO_FULL_CRDS}/argoproj.io_workflows.yaml",
        "35ffc0d16c9c71db69ae113e562d90057eac75a60e7371aa3012a3171ccd8c39", 2_838_656),
    Pin("argo-v4.1.2/argoproj.io_workflowtemplates.yaml",
        f"{ARGO_V4_1_2}/{ARGO_FULL_CRDS}/argoproj.io_workflowtemplates.yaml",
        "e932631a04a0f3a226b2ca8c68d43214c071c5d8aa6961b23298b81cbea3d9a5", 2_690_017),
    Pin("serving.kserve.io_inferenceservices.yaml",
        f"{KSERVE_V0_20_0}/config/crd/full/serving.kserve.io_inferenceservices.yaml",
        "57c3bf13f77de94678bf2ae3748056ec071ad2b9e88d6a28f44fb4710758fcff", 1_959_187),
    Pin(f"{GATEWAY_API_DIR}/gateway.networking.k8s.io_gateways.yaml",
        f"{GATEWAY_API_V1_2_1}/{GATEWAY_API_CRDS}/gateway.networking.k8s.io_gateways.yaml",
        "9aea7ae080dfe9c25a814d3d14eed28f335d28de3cbdc00a0351e0e99cb3bf06", 114_445),
    Pin(f"{GATEWAY_API_DIR}/gateway.networking.k8s.io_httproutes.yaml",
        f"{GATEWAY_API_V1_2_1}/{GATEWAY_API_CRDS}/gateway.networking.k8s.io_httproutes.yaml",
        "db36230a2f54ca3f1733bebc9d303d4db16c958856bf2be941a2c6269b872014", 336_031),
    Pin(f"{TRAINER_DIR}/trainer.kubeflow.org_trainjobs.yaml",
        f"{TRAINER_V2_3_0}/manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
        "a742cafc5b5582640c7e0b7467c024fc237256fbca5ba0a9f0531dfb66d64416", 554_665),
    Pin(f"{TRAINER_DIR}/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        f"{TRAINER_V2_3_0}/manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        "ec84dc3388fcdbe8c61d3c247a773d14458dd9438e995bea8e50d2a18080eef9", 926_571),
    Pin(f"{JOBSET_DIR}/jobset.x-k8s.io_jobsets.yaml",
        f"{JOBSET_V0_12_0}/config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
        "d022b87624512cf0b6741b31b24a2bea9945b5a838b50713af29332c878bb6fe", 823_762),
    *(Pin(f"{KUEUE_DIR}/kueue.x-k8s.io_{plural}.yaml",
          f"{KUEUE_V0_19_2}/config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml", sha256, size)
      for plural, sha256, size in (
          ("resourceflavors", "19e339c47e9ca3fa2c9eeddd27715a512f765c4794ed859733408a9715720173", 20_182),
          ("clusterqueues", "e0a5fc9b370c70f3d993d4f599865817338ecf94187b30b15b12ff33c579bd55", 85_909),
          ("localqueues", "dd10ef8d3578e7212fa52763549e7b6be0949793a5b924495fcd293330109fed", 34_771),
          # the gke stack's queued GPUs (its provisioning check); copied from Kueue's module at v0.19.2
          ("admissionchecks", "2bf4003c0a3ea3d6ceab940c7a271ad211372dab59d2739acfa8b2bdb0724acb", 13_746),
          ("provisioningrequestconfigs", "0399b2689d7468c64a1ef4e3c8bf9603c261a152f822b6698903b23f69e790dc",
           15_678))),
)}

# The 600-image sample carried in datasets/fashion-mnist-sample (see its README).
SAMPLE_SHA256: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "6be7484dc94604e404f6e3bdbd092925d99ced84cf714a176b382dadc5cce579",
    "train-labels-idx1-ubyte.gz": "7746f647948199b286bb44623ddded010e1f11ef49d78e1053eaff8193994e7e",
    "t10k-images-idx3-ubyte.gz": "05d44e7c1df713c2046d088f4c456a7f3b27a2c122c16cab43c7dfdf38c93d2e",
    "t10k-labels-idx1-ubyte.gz": "261b99b9116989080c7f8d7a0954e683296e21528d55877236505a31bdcea130",
}
