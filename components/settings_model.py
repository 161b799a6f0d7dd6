"""What a step's settings are made of: one pydantic dataclass per step whose fields say their default, bounds
and help, and the names a person sets them by. The `tritonship` options (pipelines/cli/common.py
`step_options`), the KFP pipeline's parameters (pipelines/pipeline.py, from the list of steps `Steps`:
components/release/step_settings.py `PIPELINE_STEPS`) and their check are made from these alone.

A field a person sets is declared with `setting(...)`; a field without it is the code's own (the gate's
confidence), and a field marked `flattened()` holds settings of their own whose options are the step's (the
gate's thresholds, the gate's and tune's perf_analyzer load, promote's canary; `flattened(options=...)` takes
some of them only, said in the step's words). The flat form is the settings as a person sets them: one value
per option, by the option's name, a limit that is off as 0 (`Off`), counts as comma-separated text (`Counts`).
`from_flat` and `to_flat` are the one mapping between the two forms; `to_dict` and `from_dict` hand the
settings whole, nested, from one pipeline task to the next.

A value a settings type refuses raises SettingsError (a ValueError) where the settings are built, one plain
sentence naming each refused option; the CLI names them as the user typed them (`--min-rounds`)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, get_origin

from pydantic import BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as pydantic_dataclass

T = TypeVar("T")
S = TypeVar("S", bound="StepSettings")


def _zero_is_off(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return value
    try:
        return None if float(value) == 0 else value
    except ValueError:
        return value


def _comma_separated(value: Any) -> Any:
    return tuple(part.strip() for part in value.split(",")) if isinstance(value, str) else value


OFF = BeforeValidator(_zero_is_off)
COMMA_SEPARATED = BeforeValidator(_comma_separated)
# A limit or a rate: positive, or off (None; 0 is off too, in every form).
Off = Annotated[Annotated[float, Field(gt=0)] | None, OFF]
# Counts a search tries: whole numbers of 1 or more; comma-separated text in the flat form.
Counts = Annotated[tuple[Annotated[int, Field(ge=1)], ...], COMMA_SEPARATED, Field(min_length=1)]
CONFIG = ConfigDict(extra="forbid")
SAME = ""  # a setting's pipeline parameter has the option's name


def setting(
    help: str,
    *,
    option: str | None = None,
    pipeline: str | None = SAME,
    cli: bool = True,
    flags: tuple[str, ...] = (),
    envvar: str | None = None,
    expect: str | None = None,
    **bounds: Any,
) -> Any:
    """A field a person sets: its help, its bounds (ge, gt, le, lt, pattern: pydantic's), `option` its name among
    the step's options (the field's unless given), `pipeline` its name among the pipeline's parameters (SAME: the
    option's; None: not one), `cli` whether the step's command takes it, `flags` and `envvar` the option's
    spellings and environment variable, `expect` what a refused value must be, said in words."""
    extra = {"option": option, "pipeline": pipeline, "cli": cli, "flags": list(flags), "envvar": envvar}
    return Field(description=help, json_schema_extra={**extra, "expect": expect}, **bounds)


def flattened(factory: Callable[[], Any], options: dict[str, Any] | None = None) -> Any:
    """A field of settings of their own, whose options are the step's; its default is factory(). `options`, if
    given, are the only ones the step takes, each said for this step by a `setting(...)` (its help and names; its
    bounds stay the nested type's); the rest are the code's own here."""
    said = {n: {**f.json_schema_extra, "help": f.description} for n, f in (options or {}).items()}
    return Field(default_factory=factory, json_schema_extra={"flatten": True, **({"options": said} if options else {})})


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a step: a `tritonship` option and a key of the flat form, and maybe a pipeline parameter."""

    name: str
    path: tuple[str, ...]  # the field, through flattened settings
    help: str
    default: Any  # in the flat form: the step's default settings'
    kind: Any  # the flat form's type
    pipeline: str | None
    cli: bool
    flags: tuple[str, ...]
    envvar: str | None
    expect: str | None
    off: bool
    counts: bool

    @property
    def flag(self) -> str:
        return self.flags[0] if self.flags else "--" + self.name.replace("_", "-")

    @property
    def pipeline_kind(self) -> type:
        """The pipeline parameter's type: a choice is text there."""
        return str if get_origin(self.kind) is Literal else self.kind

    def flat(self, value: Any) -> Any:
        if self.off:
            return 0.0 if value is None else value
        return ",".join(map(str, value)) if self.counts else value


class SettingsError(ValueError):
    """Settings refused: each problem one sentence in which {option} marks an option's name."""

    def __init__(self, what: str, problems: list[str], options: frozenset[str] = frozenset()) -> None:
        self.what, self.problems, self.options = what, problems, options
        super().__init__(self.said(str))

    def said(self, spell: Callable[[str], str]) -> str:
        """The message, each option spelled by `spell` (the CLI gives `--min-rounds`)."""
        marked = lambda m: spell(m[1]) if m[1] in self.options else m[0]  # noqa: E731
        return f"invalid {self.what} settings: " + "; ".join(re.sub(r"\{(\w+)\}", marked, p) for p in self.problems)


class StepSettings:
    """The base of every step's settings: its options and its flat form (see the module's docstring)."""

    WHAT: ClassVar[str] = "step"

    @classmethod
    def options(cls) -> dict[str, Option]:
        """Every option, by name, in the order of the fields."""
        return _options(cls)

    @classmethod
    def from_flat(cls: type[S], **flat: Any) -> S:
        """From the flat form (CLI options, KFP parameters: text or floats for whole numbers as KFP hands them
        over); a missing option takes its default, an unknown one is refused."""
        options = cls.options()
        unknown = sorted(set(flat) - set(options))
        if unknown:
            raise SettingsError(cls.WHAT, [f"no parameter named {', '.join(unknown)}"])
        nested: dict[str, Any] = {}
        for name, value in flat.items():
            *parents, last = options[name].path
            _child(nested, parents)[last] = value
        return cls(**_with_defaults(cls, nested))

    def to_flat(self) -> dict[str, Any]:
        """The flat form: every option's value by its name (the inverse of from_flat)."""
        return {name: o.flat(_at(self, o.path)) for name, o in self.options().items()}

    def to_dict(self) -> dict[str, Any]:
        """The whole settings, nested as declared, in JSON's types: how one pipeline task hands them to another.
        A setting that is None is left out (KFP refuses None inside a dict parameter); from_dict gives it back as
        its default, which is None for every such setting: one that is not would not travel, and is refused."""
        whole = _adapter(type(self)).dump_python(self, mode="json", exclude_none=True)
        if type(self).from_dict(whole) != self:
            raise TypeError(f"{type(self).__name__} has a setting that is None where its default is not")
        return whole

    @classmethod
    def from_dict(cls: type[S], whole: dict[str, Any]) -> S:
        """Back from to_dict, checked as where they were built (a whole number may come back as a float)."""
        return cls(**whole)

    def within(self, steps: Mapping[str, StepSettings]) -> StepSettings:
        """These settings as a run of `steps` (every step's settings, by step) takes them: as they are, unless a
        step follows another's (tune measures at the gate's load)."""
        return self


class Steps(dict[str, type[StepSettings]]):
    """A list of steps: each step's settings type by its name in a pipeline, whose settings that are pipeline
    parameters (`Option.pipeline`) are the pipeline's parameters, with `defaults` where the pipeline's differ."""

    def __init__(self, kinds: Mapping[str, type[StepSettings]], defaults: Mapping[str, Any]) -> None:
        super().__init__(kinds)
        self.defaults = dict(defaults)

    def parameters(self) -> dict[str, Option]:
        """Every step setting that is a pipeline parameter, by its pipeline name, with the pipeline's default. One
        parameter may feed several steps (load_timeout_s: stage's and promote's)."""
        found: dict[str, Option] = {}
        for kind in self.values():
            for option in kind.options().values():
                if option.pipeline is None:
                    continue
                chosen = dataclasses.replace(option, default=self.defaults.get(option.pipeline, option.default))
                same = found.setdefault(option.pipeline, chosen)
                if (same.help, same.default, same.pipeline_kind) != (chosen.help, chosen.default, chosen.pipeline_kind):
                    raise TypeError(f"the pipeline parameter {option.pipeline} is two different settings")
        return found

    def settings(self, given: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The pipeline's parameters (by pipeline name; a missing one takes the pipeline's default) as each step's
        settings, whole (to_dict: the step's task rebuilds them with from_dict), by step. Every step's are built, so
        checked: a wrong value fails before anything runs."""
        parameters = self.parameters()
        unknown = sorted(set(given) - set(parameters))
        if unknown:
            raise SettingsError("pipeline", [f"no parameter named {', '.join(unknown)}"])
        values = {name: given.get(name, p.default) for name, p in parameters.items()}
        steps = {
            step: kind.from_flat(**{o.name: values[o.pipeline] for o in kind.options().values() if o.pipeline})
            for step, kind in self.items()
        }
        return {step: chosen.within(steps).to_dict() for step, chosen in steps.items()}


def step_settings(what: str) -> Callable[[type[T]], type[T]]:
    """Make a settings class a frozen pydantic dataclass (unknown names refused), whose refusals are a
    SettingsError naming `what` ("invalid gate settings: ...")."""

    def make(cls: type[T]) -> type[T]:
        made: Any = pydantic_dataclass(frozen=True, config=CONFIG)(cls)
        made.WHAT = what
        validate = made.__init__

        @functools.wraps(validate)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                validate(self, *args, **kwargs)
            except ValidationError as exc:
                raise SettingsError(
                    what, _problems(type(self), exc, kwargs), frozenset(_declared(type(self)))
                ) from None

        made.__init__ = __init__
        return made

    return make


def refuse(*problems: str) -> None:
    """A cross-field check's refusal (in a model_validator): the non-empty problems, {option} marking options."""
    if any(problems):
        raise ValueError("; ".join(p for p in problems if p))


# ------------------------------------------------------------------------------------------ the machinery
@functools.cache
def _adapter(cls: Any) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def _fields(cls: Any) -> dict[str, Any]:
    return cls.__pydantic_fields__


@functools.cache
def _declared(cls: Any, path: tuple[str, ...] = ()) -> dict[str, Option]:
    """Every option of `cls` as declared, without its default (None)."""
    found: dict[str, Option] = {}
    for field, info in _fields(cls).items():
        extra = info.json_schema_extra or {}
        if extra.get("flatten"):
            inner = _declared(info.annotation, (*path, field))
            if "options" in extra:
                inner = {n: _said(inner[n], said) for n, said in extra["options"].items()}
            if set(inner) & set(found):
                raise TypeError(f"{cls.__name__}: two settings are the option {min(set(inner) & set(found))}")
            found |= inner
        elif "option" in extra:
            off, counts = OFF in info.metadata, COMMA_SEPARATED in info.metadata
            name = extra["option"] or field
            if name in found:
                raise TypeError(f"{cls.__name__}: two settings are the option {name}")
            found[name] = Option(
                name,
                (*path, field),
                info.description or "",
                None,
                float if off else str if counts else info.annotation,
                name if extra["pipeline"] == SAME else extra["pipeline"],
                extra["cli"],
                tuple(extra["flags"]),
                extra["envvar"],
                extra["expect"],
                off,
                counts,
            )
    return found


def _said(option: Option, said: dict[str, Any]) -> Option:
    """A nested option as the step that nests it says it (flattened's `options`)."""
    return dataclasses.replace(
        option,
        help=said["help"],
        pipeline=option.name if said["pipeline"] == SAME else said["pipeline"],
        cli=said["cli"],
        flags=tuple(said["flags"]) or option.flags,
        envvar=said["envvar"],
        expect=said["expect"] or option.expect,
    )


@functools.cache
def _options(cls: Any) -> dict[str, Option]:
    default = cls()
    return {n: dataclasses.replace(o, default=o.flat(_at(default, o.path))) for n, o in _declared(cls).items()}


def _child(nested: dict[str, Any], path: list[str]) -> dict[str, Any]:
    for part in path:
        nested = nested.setdefault(part, {})
    return nested


def _with_defaults(cls: Any, nested: dict[str, Any]) -> dict[str, Any]:
    """Flattened settings given in part start from the default's (tune's load is not LoadSettings())."""
    for field, info in _fields(cls).items():
        if (info.json_schema_extra or {}).get("flatten") and isinstance(nested.get(field), dict):
            default = info.get_default(call_default_factory=True)
            whole = {f.name: getattr(default, f.name) for f in dataclasses.fields(default) if f.init}
            nested[field] = whole | _with_defaults(info.annotation, nested[field])
    return nested


_MISSING = object()


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value.get(part, _MISSING) if isinstance(value, dict) else getattr(value, part, _MISSING)
        if value is _MISSING:
            break
    return value


def _problems(cls: Any, exc: ValidationError, given: dict[str, Any]) -> list[str]:
    options = {o.path: o for o in _declared(cls).values()}
    problems = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if error["type"] in ("value_error", "assertion_error"):
            problems.append(str(error["ctx"]["error"]))
            continue
        if error["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            problems.append(f"no parameter named {loc[-1]}")
            continue
        option = next((options[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in options), None)
        value = _at(given, option.path) if option else _MISSING
        value = error["input"] if value is _MISSING else value
        name = "{" + option.name + "}" if option else ".".join(map(str, loc))
        if option and option.expect:
            problems.append(f"{name} must be {option.expect}, not {value!r}")
        else:
            problems.append(f"{name} {_predicate(error, option)}, not {value!r}")
    return problems


def _predicate(error: Any, option: Option | None) -> str:
    kind, ctx = error["type"], error.get("ctx", {})
    if kind == "greater_than_equal":
        return "must not be negative" if ctx["ge"] == 0 else f"must be at least {ctx['ge']}"
    if kind == "greater_than":
        off = " (0 is off)" if option and option.off else ""
        return f"must be positive{off}" if ctx["gt"] == 0 else f"must be more than {ctx['gt']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if kind == "less_than":
        return f"must be below {ctx['lt']}"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", ctx["expected"])
        return f"must be one of {', '.join(choices)}"
    if kind.startswith("int_"):
        return "must be a whole number"
    if kind.startswith("float_"):
        return "must be a number"
    if kind.startswith("bool_"):
        return "must be true or false"
    if kind.startswith("string_"):
        return "must be text"
    return f"is wrong ({error['msg'][0].lower()}{error['msg'][1:]})"
