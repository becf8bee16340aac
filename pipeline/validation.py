"""Settings files of sections, validated with pydantic, whose every error is one line naming its key.

A file (or a Pulumi stack's config) is a mapping of sections; each section is a model (`Section`:
camelCase keys, unknown keys refused, frozen once parsed) whose keys are declared once with their
type, default, constraint and meaning. The value types below hold the constraints many keys share
(`WholeNumber`, `Text`, `matching(pattern, meaning)`, ...); a validator refuses a value with
`fail(message, at)`. `config_error` turns pydantic's first error into a ConfigError such as
`pipeline.workers: must be an integer >= 1, got 0`, and `schema_command` is the `--schema` command
that prints a file's JSON Schema for editors. Nothing here knows what the sections mean: the
pipeline's are in pipeline/config.py, the stacks' in stacks/.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Annotated, Any, Callable, ClassVar, Mapping, Sequence, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    Strict,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Kubernetes quantities as users write them: 500m, 1, 1.5, 2Gi, 512Mi. Our own pattern rather than
# kubernetes.utils.parse_quantity: that parser is built on Decimal and accepts what the API server
# refuses ("NaN", "Infinity", " 1", "1_000", True).
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
# Go durations as Argo's memoize.maxAge takes them: 30s, 15m, 24h, 1h30m.
DURATION = r"^(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?$"
# A Kubernetes object name (DNS-1123 label).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
NOT_BLANK = r"\S"
# What a value matching each pattern is, for errors (`must be a DNS-1123 label, got ...`).
MEANINGS: dict[str, str] = {NOT_BLANK: "a non-empty string"}


class ConfigError(ValueError):
    """A setting is missing or wrong; the message starts with its key, e.g. `pipeline.workers`."""


def fail(message: str, at: str = "") -> PydanticCustomError:
    """An error of a validator, `at` a key below the one validated (`maxReplicas` in serving)."""
    return PydanticCustomError("config", message, {"at": at})


# --- Value types: the constraints every section's keys share ---------------------------------------

def _integral_float_as_int(value: Any) -> Any:
    """Pulumi hands structured numbers over as floats: 2.0 means 2 (and 2.5 stays an error)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int_as_float(value: Any) -> Any:
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


# Strict: a bool (an int to Python) or a string of digits is never a number here.
WholeNumber = Annotated[int, BeforeValidator(_integral_float_as_int), Strict()]
# A whole number >= 1 that may be absent (None: a default rule); the bound inside, for the JSON Schema.
Positive = Annotated[WholeNumber, Field(ge=1)]
Number = Annotated[float, BeforeValidator(_int_as_float), Strict(), Field(allow_inf_nan=False)]
Text = Annotated[str, Strict(), Field(min_length=1, pattern=NOT_BLANK)]
Flag = Annotated[bool, Strict()]  # true or false, never "yes", 1 or a string


def matching(pattern: str, meaning: str) -> Any:
    """A non-empty string matching `pattern`; an error says it must be `meaning`."""
    MEANINGS[pattern] = meaning
    return Annotated[str, Strict(), Field(min_length=1, pattern=pattern)]


DnsLabel = matching(DNS_LABEL, "a DNS-1123 label")
Duration = matching(DURATION, "a duration like 30m, 24h or 1h30m")
Quantity = Annotated[matching(QUANTITY, "a Kubernetes quantity like 500m, 2 or 4Gi"),
                     BeforeValidator(lambda value: str(value) if isinstance(value, (int, float))
                                     and not isinstance(value, bool) else value)]


QUANTITY_UNITS = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                  "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_value(quantity: str) -> float:
    """The number a Quantity stands for (`500m` -> 0.5, `4Gi` -> 4294967296)."""
    number, unit = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", quantity).groups()
    return float(number) * QUANTITY_UNITS[unit]


def duration_seconds(duration: str) -> int:
    """The seconds of a Duration (`1h30m` -> 5400)."""
    hours, minutes, seconds = (int(part or 0) for part in re.match(DURATION, duration).groups())
    return hours * 3600 + minutes * 60 + seconds


def _without_keys_not_here(schema: dict, model: type[Section]) -> None:
    for key in model.NOT_HERE:
        schema.get("properties", {}).pop(key, None)


class Section(BaseModel):
    """One section of settings: camelCase keys, unknown keys are errors, frozen once parsed."""
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel,
                              json_schema_extra=_without_keys_not_here)
    # How an unknown key is called in errors.
    UNKNOWN: ClassVar[str] = "unknown setting"
    # Keys a related section has that are errors here, with why (the local engine's keys on a stack):
    # refused in input, left out of dumps and of the JSON Schema.
    NOT_HERE: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _keys_of_this_section(cls, raw: Any) -> Any:
        if raw is None:
            return {}  # a YAML section with every key commented out
        for key in raw if isinstance(raw, Mapping) else ():
            if not isinstance(key, str):
                raise fail(f"keys must be text, got {key!r}")
            if key in cls.NOT_HERE:
                raise fail(cls.NOT_HERE[key], key)
        return raw

    @model_serializer(mode="wrap")
    def _dumped(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A dump that parses back into the same section."""
        data = handler(self)
        return self._shown(data) if isinstance(data, dict) else data

    def _shown(self, data: dict) -> dict:
        hidden = {key for name, field in type(self).model_fields.items() if field.alias in self.NOT_HERE
                  for key in (name, field.alias)}
        return {key: value for key, value in data.items() if key not in hidden}


# --- Errors: pydantic's, as one line naming the key -------------------------------------------------

def _field(model: type[BaseModel], key: Any) -> Any:
    return next((field for name, field in model.model_fields.items() if (field.alias or name) == key), None)


def _section_in(annotation: Any) -> type[BaseModel] | None:
    """The section model an annotation holds (directly, optional, or as list items)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, tuple, list, Annotated) or type(annotation).__name__ == "UnionType":
        for arg in get_args(annotation):
            found = _section_in(arg)
            if found is not None:
                return found
    return None


def section_at(model: type[BaseModel] | None, loc: Sequence[Any]) -> type[BaseModel] | None:
    """The section model at a key path below `model` (list indexes pass through), or None."""
    for key in loc:
        if model is None:
            return None
        if isinstance(key, int):
            continue
        field = _field(model, key)
        model = _section_in(field.annotation) if field is not None else None
    return model


PLAIN_KEY = r"[-\w:]+"


def key_path(loc: Sequence[Any], root: str = "") -> str:
    """`section.key[0].key`; a key that is not a plain word is quoted, so the error stays one line."""
    path = root
    for key in loc:
        if isinstance(key, int):
            path += f"[{key}]"
        else:
            shown = key if re.fullmatch(PLAIN_KEY, str(key)) else repr(key)
            path += f"{'.' if path else ''}{shown}"
    return path


def _constraints(field: Any) -> list[Any]:
    """A field's constraints, also those inside an optional type (`Positive | None`)."""
    found = list(field.metadata)
    for arg in get_args(field.annotation):
        for item in getattr(arg, "__metadata__", ()):
            found += [item, *getattr(item, "metadata", ())]
    return found


def _bound(model: type[BaseModel] | None, key: Any) -> str:
    field = _field(model, key) if model is not None else None
    for constraint in (_constraints(field) if field is not None else ()):
        if getattr(constraint, "ge", None) is not None:
            return f" >= {constraint.ge}"
    return ""


def _quoted(expected: str) -> str:
    return ", ".join(re.findall(r"'([^']*)'", expected)) or expected


def _problem(error: dict, model: type[BaseModel] | None) -> str:
    """What is wrong, in the words the hand-written checks used."""
    kind, ctx, got = error["type"], error.get("ctx") or {}, error.get("input")
    loc = error["loc"]
    parent = section_at(model, loc[:-1])
    if kind == "config":
        return error["msg"]
    if kind == "extra_forbidden":
        known = sorted((field.alias or name) for name, field in parent.model_fields.items()) if parent else []
        unknown = parent.UNKNOWN if parent else Section.UNKNOWN
        return f"{unknown}; known: {', '.join(known)}" if known else unknown
    if kind == "missing":
        return "is required"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return f"must be an integer{_bound(parent, loc[-1] if loc else None)}, got {got!r}"
    if kind in ("float_type", "finite_number", "float_parsing"):
        return f"must be a number{_bound(parent, loc[-1] if loc else None)}, got {got!r}"
    if kind in ("greater_than_equal", "less_than_equal"):
        what = "a number" if isinstance(ctx.get("ge", ctx.get("le")), float) else "an integer"
        bound = f">= {ctx['ge']:g}" if "ge" in ctx else f"<= {ctx['le']:g}"
        return f"must be {what} {bound}, got {got!r}"
    if kind == "bool_type":
        return f"must be true or false, got {got!r}"
    if kind in ("string_type", "string_too_short"):
        return f"must be a non-empty string, got {got!r}"
    if kind == "string_pattern_mismatch":
        return f"must be {MEANINGS.get(ctx['pattern'], 'like ' + ctx['pattern'])}, got {got!r}"
    if kind == "literal_error":
        return f"must be one of {_quoted(ctx['expected'])}, got {got!r}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a mapping of settings, got {type(got).__name__}"
    if kind in ("tuple_type", "list_type"):
        return f"must be a list, got {type(got).__name__}"
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}, got {got!r}"


def config_error(error: ValidationError, model: type[BaseModel] | None, root: str = "",
                 skip: int = 0) -> ConfigError:
    """The first of pydantic's errors as `key.path: problem`; `skip` leading parts of its location are
    not keys (a union's tag)."""
    first = error.errors(include_url=False)[0]
    loc = tuple(first["loc"][skip:])
    at = (first.get("ctx") or {}).get("at") if first["type"] == "config" else ""
    path = key_path((*loc, *(at.split(".") if at else [])), root)
    return ConfigError(f"{path or 'config'}: {_problem({**first, 'loc': loc}, model)}")


# --- JSON Schema ---------------------------------------------------------------------------------

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


# Bounds pydantic leaves under its own names inside an optional type (`Positive | None`).
BOUND_KEYWORDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def standard_keywords(schema: Any) -> Any:
    """`schema` with every bound named as JSON Schema names it, so that editors check it."""
    if isinstance(schema, list):
        return [standard_keywords(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    numeric = schema.get("type") in ("integer", "number")
    return {(BOUND_KEYWORDS.get(key, key) if numeric else key): standard_keywords(value)
            for key, value in schema.items()}


def schema_command(prog: str, schema: Callable[[], dict], argv: Sequence[str] | None) -> int:
    """`python -m <prog> --schema`: prints the JSON Schema; anything else is a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--schema"]:
        print(f"usage: python -m {prog} --schema", file=sys.stderr)
        return 2
    print(json.dumps(schema(), indent=2))
    return 0
