"""Fashion-MNIST's files: their names, the official MD5s and mirror, and the manifest ingest writes
beside them. Standard library only: the pipeline and the stack config read these without NumPy.
"""

from __future__ import annotations

SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FILE_NAMES = tuple(name for pair in SPLIT_FILES.values() for name in pair)

# The full dataset's item counts and the MD5s its authors publish for the .gz files.
FULL_COUNTS = {"train": 60_000, "test": 10_000}
OFFICIAL_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
# The authors' mirror of the four files (github.com/zalandoresearch/fashion-mnist): the default source.
OFFICIAL_MIRROR = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

MANIFEST_NAME = "manifest.json"
