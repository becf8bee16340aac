"""dist-ml's policy pack: `pulumi preview --stack gke --policy-pack policy` (the PR check runs it).

Its own virtualenv (policy/requirements.txt): pulumi-policy pins protobuf 5, the project's lock has
TensorFlow's protobuf 6. The checks themselves are stacks/policies.py's, through stacks/policy_pack.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's packages

from pulumi_policy import EnforcementLevel, PolicyPack, StackValidationPolicy  # noqa: E402
from pulumi_policy.proxy import UnknownValueError  # noqa: E402

from stacks.policy_pack import POLICIES, stack_validator  # noqa: E402

PolicyPack(
    name="dist-ml",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[StackValidationPolicy(name=name, description=description,
                                    validate=stack_validator(check, UnknownValueError))
              for name, (description, check) in POLICIES.items()],
)
