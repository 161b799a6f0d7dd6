"""Triton model configuration (config.pbtxt) built from a signature, parsed and written with Triton's
own protobuf definitions (tritonclient ships model_config_pb2), so what we write is what Triton reads."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from components.errors import TritonshipError
from components.model.signature import DTYPES, NAME_PATTERN, Signature
from components.settings import DEFAULT_INTRA_OP_THREADS

ModelConfig = mc.ModelConfig
PYTORCH_PLATFORM = "pytorch_libtorch"  # Triton's PyTorch (libtorch) backend, what production serves model.pt with
# The same backend (r26.03 and later) serving an AOTInductor package, model.pt2 (components/model/aoti.py)
AOTI_PLATFORM = "torch_aoti"
MODEL_FILES = {PYTORCH_PLATFORM: "model.pt", AOTI_PLATFORM: "model.pt2"}
# The PyTorch backend's parameters that tritonship sets. INTER_OP_THREAD_COUNT is never set: in r24.10 the
# backend calls at::set_num_interop_threads for every model that names it, which throws on the second call in
# a process and aborts the whole server (docs/design.md section 5).
INTRA_OP_PARAMETER = "INTRA_OP_THREAD_COUNT"
INTER_OP_PARAMETER = "INTER_OP_THREAD_COUNT"
# "true" runs the TorchScript graph as traced, without the profiling executor's shape specialisation and
# fusion; off (absent) is the backend's default.
UNOPTIMIZED_PARAMETER = "DISABLE_OPTIMIZED_EXECUTION"


CANDIDATE_SUFFIX = "__candidate"


class ModelConfigError(TritonshipError):
    """A config.pbtxt that cannot be parsed or does not match the model's signature."""


def validate_model_name(name: str) -> str:
    """A Triton model name that is also one safe S3 key segment (no '/', no '..', no control characters)."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise ModelConfigError(
            f"model name {name!r} is not valid; use letters, digits, '_', '.', '-' (at most 128, not starting "
            "with '.' or '-', no '..')."
        )
    if CANDIDATE_SUFFIX in name:
        raise ModelConfigError(f"model name {name!r} must not contain '{CANDIDATE_SUFFIX}' (reserved for candidates).")
    return name


@dataclass(frozen=True)
class ServingSettings:
    """The knobs of config.pbtxt that change speed, not results (tuned by the tuning step)."""

    max_batch_size: int | None = None  # None: the signature's
    dynamic_batching: bool = True
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    instance_count: int = 1
    # an ensemble's Python pre/post steps, whose per-request cost is CPU and scales with processes rather
    # than with the model's instances (None: instance_count; ignored for a single model)
    step_instance_count: int | None = None
    # the PyTorch backend's intra-op threads (at::set_num_threads). Always written: the setting is the
    # process's, and a model that names none runs with whatever the model loaded before it set.
    intra_op_threads: int = DEFAULT_INTRA_OP_THREADS
    # the TorchScript profiling executor (the backend's default). It specialises and fuses the graph for each
    # new input shape it meets, a pause each time; under dynamic batching every batch size is a new shape.
    # Tune tries it off for GPU models (docs/design.md section 5).
    optimized_execution: bool = True

    def __post_init__(self) -> None:
        if self.intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be at least 1, not {self.intra_op_threads}")


def build(
    name: str,
    signature: Signature,
    gpu: bool = False,
    settings: ServingSettings | None = None,
    python_step: bool = False,
    platform: str = PYTORCH_PLATFORM,
) -> ModelConfig:
    """The config.pbtxt for a compiled model (Triton's PyTorch backend) or, with `python_step`, an
    ensemble's Python-backend step: inputs/outputs in the signature's order.

    Triton's PyTorch backend binds tensors whose names follow neither its INPUT__<i> convention nor
    the forward() argument names by position, so the signature's order must be forward()'s order
    (the export step checks that by running the model).
    """
    settings = settings or ServingSettings()
    config = mc.ModelConfig(name=name)
    if python_step:
        config.backend = "python"
    else:
        config.platform = platform
        if platform == AOTI_PLATFORM:  # 2.51's core would name model.pt for a backend it knows nothing of
            config.default_model_filename = MODEL_FILES[platform]
        config.parameters[INTRA_OP_PARAMETER].string_value = str(settings.intra_op_threads)
    batched = signature.batch
    config.max_batch_size = (settings.max_batch_size or signature.max_batch_size) if batched else 0
    for specs, field in ((signature.inputs, config.input), (signature.outputs, config.output)):
        for spec in specs:
            tensor = field.add(name=spec.name, data_type=mc.DataType.Value(spec.triton_type))
            tensor.dims.extend(spec.shape[1:] if batched else spec.shape)
    if batched and settings.dynamic_batching:
        config.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_us
        config.dynamic_batching.preferred_batch_size.extend(settings.preferred_batch_sizes)
    kind = mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU
    config.instance_group.add(kind=kind, count=settings.instance_count)
    return config


# Triton 26.01 and later: each request's latency counted per bucket, for every model, with
# --metrics-config=histogram_latencies=true (components/serving/live_metrics.py). Buckets 2^(1/4) apart from
# 0.05 ms to about 25 s: a p99 placed within its bucket by interpolation is off by less than a fifth of it.
LATENCY_HISTOGRAM = "nv_inference_first_response_histogram_ms"
LATENCY_BUCKETS_MS = tuple(round(0.05 * 2 ** (i / 4), 4) for i in range(77))


def with_latency_buckets(config: ModelConfig) -> ModelConfig:
    """A copy of `config` whose latency histogram has LATENCY_BUCKETS_MS. Only for a server that exports such
    histograms: an older Triton refuses the `model_metrics` field."""
    bucketed = mc.ModelConfig()
    bucketed.CopyFrom(config)
    del bucketed.model_metrics.metric_control[:]
    control = bucketed.model_metrics.metric_control.add()
    control.metric_identifier.family = LATENCY_HISTOGRAM
    control.histogram_options.buckets.extend(LATENCY_BUCKETS_MS)
    return bucketed


def pin_version(config: ModelConfig, *versions: int) -> ModelConfig:
    """A copy of `config` whose version_policy serves exactly `versions` (the promoted one; during an
    ensemble switch, a member's old and new version)."""
    pinned = mc.ModelConfig()
    pinned.CopyFrom(config)
    pinned.version_policy.Clear()
    pinned.version_policy.specific.versions.extend(versions)
    return pinned


def renamed(config: ModelConfig, name: str) -> ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    copy.name = name
    return copy


def with_settings(config: ModelConfig, settings: ServingSettings) -> ModelConfig:
    copy = mc.ModelConfig()
    copy.CopyFrom(config)
    if settings.max_batch_size is not None and copy.max_batch_size > 0:
        copy.max_batch_size = settings.max_batch_size
    copy.ClearField("dynamic_batching")
    if settings.dynamic_batching and copy.max_batch_size > 0:
        copy.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_us
        copy.dynamic_batching.preferred_batch_size.extend(settings.preferred_batch_sizes)
    for group in copy.instance_group:
        group.count = settings.instance_count
    if copy.platform in MODEL_FILES:
        copy.parameters[INTRA_OP_PARAMETER].string_value = str(settings.intra_op_threads)
    if copy.platform == PYTORCH_PLATFORM:
        if settings.optimized_execution:
            copy.parameters.pop(UNOPTIMIZED_PARAMETER, None)
        else:
            copy.parameters[UNOPTIMIZED_PARAMETER].string_value = "true"
    return copy


def optimized_execution(config: ModelConfig) -> bool:
    """Whether the PyTorch backend runs a config's TorchScript with the profiling executor (its default)."""
    value = config.parameters[UNOPTIMIZED_PARAMETER].string_value if UNOPTIMIZED_PARAMETER in config.parameters else ""
    return value.strip().lower() not in ("true", "1", "yes", "on")


def intra_op_threads(config: ModelConfig) -> int:
    """The PyTorch backend's intra-op thread count a config serves with (the default when it names none)."""
    value = config.parameters[INTRA_OP_PARAMETER].string_value if INTRA_OP_PARAMETER in config.parameters else ""
    return int(value) if value.strip().isdigit() and int(value) > 0 else DEFAULT_INTRA_OP_THREADS


def refuse_server_aborting_parameters(config: ModelConfig, source: str = "config.pbtxt") -> None:
    """Refuse what would abort a PyTorch-backend server rather than fail one model (see INTER_OP_PARAMETER)."""
    if INTER_OP_PARAMETER in config.parameters:
        raise ModelConfigError(
            f"{source} sets {INTER_OP_PARAMETER}, which makes Triton's PyTorch backend (r24.10) abort the whole "
            f"server once a second model sets it or the model is reloaded; remove that parameter "
            f"({INTRA_OP_PARAMETER} is the thread setting tritonship tunes)."
        )


def to_pbtxt(config: ModelConfig) -> str:
    return text_format.MessageToString(config)


def parse_pbtxt(text: str, source: str = "config.pbtxt") -> ModelConfig:
    try:
        return text_format.Parse(text, mc.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{source} is not a valid Triton model configuration: {exc}.") from None


def to_json(config: ModelConfig) -> str:
    """The JSON form that Triton's load API takes as the `config` parameter."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def check_against(config: ModelConfig, signature: Signature, source: str = "config.pbtxt") -> None:
    """Raise if the config's tensors are not the signature's (names, types, dims, batching)."""
    batched = signature.batch
    if (config.max_batch_size > 0) != batched:
        raise ModelConfigError(
            f"{source}: max_batch_size is {config.max_batch_size} but the signature says batch: {str(batched).lower()}."
        )
    for kind, specs, tensors in (
        ("input", signature.inputs, config.input),
        ("output", signature.outputs, config.output),
    ):
        got = [t.name for t in tensors]
        want = [s.name for s in specs]
        if got != want:
            raise ModelConfigError(f"{source}: {kind}s are {got}, the signature says {want}.")
        for spec, tensor in zip(specs, tensors, strict=True):
            dims = list(spec.shape[1:] if batched else spec.shape)
            if list(tensor.dims) != dims:
                raise ModelConfigError(
                    f"{source}: {kind} '{spec.name}' dims are {list(tensor.dims)}, the signature says {dims}."
                )
            if mc.DataType.Name(tensor.data_type) != DTYPES[spec.dtype][2]:
                raise ModelConfigError(
                    f"{source}: {kind} '{spec.name}' is {mc.DataType.Name(tensor.data_type)}, the signature says {spec.dtype}."
                )
