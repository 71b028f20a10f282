from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SpeculationOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPECULATION_OFF: _ClassVar[SpeculationOutcome]
    SPECULATION_HIT: _ClassVar[SpeculationOutcome]
    SPECULATION_PARTIAL: _ClassVar[SpeculationOutcome]
    SPECULATION_MISS: _ClassVar[SpeculationOutcome]

class OpCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_UNSPECIFIED: _ClassVar[OpCode]
    SET_TENSOR: _ClassVar[OpCode]
    GET_TENSOR: _ClassVar[OpCode]
    KV_TRIM: _ClassVar[OpCode]
    ARGMAX: _ClassVar[OpCode]
    STEP: _ClassVar[OpCode]
SPECULATION_OFF: SpeculationOutcome
SPECULATION_HIT: SpeculationOutcome
SPECULATION_PARTIAL: SpeculationOutcome
SPECULATION_MISS: SpeculationOutcome
OP_UNSPECIFIED: OpCode
SET_TENSOR: OpCode
GET_TENSOR: OpCode
KV_TRIM: OpCode
ARGMAX: OpCode
STEP: OpCode

class EchoMessage(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerIdentity(_message.Message):
    __slots__ = ("name", "label", "host", "pid", "boot_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    label: str
    host: str
    pid: int
    boot_id: str
    def __init__(self, name: _Optional[str] = ..., label: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., boot_id: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("spec", "fingerprint", "precision", "vocab_size", "context_length", "config_msgpack", "walked_ops", "unwalked")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PRECISION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_MSGPACK_FIELD_NUMBER: _ClassVar[int]
    WALKED_OPS_FIELD_NUMBER: _ClassVar[int]
    UNWALKED_FIELD_NUMBER: _ClassVar[int]
    spec: str
    fingerprint: str
    precision: str
    vocab_size: int
    context_length: int
    config_msgpack: bytes
    walked_ops: int
    unwalked: str
    def __init__(self, spec: _Optional[str] = ..., fingerprint: _Optional[str] = ..., precision: _Optional[str] = ..., vocab_size: _Optional[int] = ..., context_length: _Optional[int] = ..., config_msgpack: _Optional[bytes] = ..., walked_ops: _Optional[int] = ..., unwalked: _Optional[str] = ...) -> None: ...

class WorkerCounters(_message.Message):
    __slots__ = ("sessions_opened", "sessions_active", "forward_passes", "draft_tokens", "peak_rss_bytes", "rss_bytes", "prespec_hits", "prespec_partial", "prespec_misses", "speculative_passes", "paced_passes", "pace_overruns", "pace_headroom")
    SESSIONS_OPENED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PEAK_RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_HITS_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_MISSES_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_PASSES_FIELD_NUMBER: _ClassVar[int]
    PACED_PASSES_FIELD_NUMBER: _ClassVar[int]
    PACE_OVERRUNS_FIELD_NUMBER: _ClassVar[int]
    PACE_HEADROOM_FIELD_NUMBER: _ClassVar[int]
    sessions_opened: int
    sessions_active: int
    forward_passes: int
    draft_tokens: int
    peak_rss_bytes: int
    rss_bytes: int
    prespec_hits: int
    prespec_partial: int
    prespec_misses: int
    speculative_passes: int
    paced_passes: int
    pace_overruns: int
    pace_headroom: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sessions_opened: _Optional[int] = ..., sessions_active: _Optional[int] = ..., forward_passes: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., peak_rss_bytes: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., prespec_hits: _Optional[int] = ..., prespec_partial: _Optional[int] = ..., prespec_misses: _Optional[int] = ..., speculative_passes: _Optional[int] = ..., paced_passes: _Optional[int] = ..., pace_overruns: _Optional[int] = ..., pace_headroom: _Optional[_Iterable[int]] = ...) -> None: ...

class Pace(_message.Message):
    __slots__ = ("profile", "machine", "machine_name", "draft_tokens_per_second")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    MACHINE_FIELD_NUMBER: _ClassVar[int]
    MACHINE_NAME_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    profile: str
    machine: str
    machine_name: str
    draft_tokens_per_second: float
    def __init__(self, profile: _Optional[str] = ..., machine: _Optional[str] = ..., machine_name: _Optional[str] = ..., draft_tokens_per_second: _Optional[float] = ...) -> None: ...

class PassTime(_message.Message):
    __slots__ = ("rows", "seconds")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    seconds: float
    def __init__(self, rows: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol_version", "identity", "model", "backends", "draft_tokens_per_second", "max_sessions", "counters", "echo_port", "auth_proof", "pace", "compute", "pass_curve", "tree_replies")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    ECHO_PORT_FIELD_NUMBER: _ClassVar[int]
    AUTH_PROOF_FIELD_NUMBER: _ClassVar[int]
    PACE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    PASS_CURVE_FIELD_NUMBER: _ClassVar[int]
    TREE_REPLIES_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    identity: WorkerIdentity
    model: ModelInfo
    backends: _containers.RepeatedScalarFieldContainer[str]
    draft_tokens_per_second: float
    max_sessions: int
    counters: WorkerCounters
    echo_port: int
    auth_proof: str
    pace: Pace
    compute: str
    pass_curve: _containers.RepeatedCompositeFieldContainer[PassTime]
    tree_replies: bool
    def __init__(self, protocol_version: _Optional[int] = ..., identity: _Optional[_Union[WorkerIdentity, _Mapping]] = ..., model: _Optional[_Union[ModelInfo, _Mapping]] = ..., backends: _Optional[_Iterable[str]] = ..., draft_tokens_per_second: _Optional[float] = ..., max_sessions: _Optional[int] = ..., counters: _Optional[_Union[WorkerCounters, _Mapping]] = ..., echo_port: _Optional[int] = ..., auth_proof: _Optional[str] = ..., pace: _Optional[_Union[Pace, _Mapping]] = ..., compute: _Optional[str] = ..., pass_curve: _Optional[_Iterable[_Union[PassTime, _Mapping]]] = ..., tree_replies: _Optional[bool] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "draft_top_k", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOP_K_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    draft_top_k: int
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., draft_top_k: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("open", "round", "verifying")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VERIFYING_FIELD_NUMBER: _ClassVar[int]
    open: Open
    round: Round
    verifying: Verifying
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., round: _Optional[_Union[Round, _Mapping]] = ..., verifying: _Optional[_Union[Verifying, _Mapping]] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("protocol_version", "prompt_tokens", "sampling", "k", "vocab_fingerprint", "prespec", "cache_key", "processing")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_FIELD_NUMBER: _ClassVar[int]
    CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    prompt_tokens: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    k: int
    vocab_fingerprint: str
    prespec: PreSpeculation
    cache_key: str
    processing: LogitsProcessing
    def __init__(self, protocol_version: _Optional[int] = ..., prompt_tokens: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., k: _Optional[int] = ..., vocab_fingerprint: _Optional[str] = ..., prespec: _Optional[_Union[PreSpeculation, _Mapping]] = ..., cache_key: _Optional[str] = ..., processing: _Optional[_Union[LogitsProcessing, _Mapping]] = ...) -> None: ...

class LogitsProcessing(_message.Message):
    __slots__ = ("logit_bias", "repetition_penalty", "presence_penalty", "frequency_penalty", "grammar", "grammar_source", "output_tokens")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_SOURCE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    logit_bias: _containers.ScalarMap[int, float]
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    grammar: str
    grammar_source: str
    output_tokens: int
    def __init__(self, logit_bias: _Optional[_Mapping[int, float]] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., grammar: _Optional[str] = ..., grammar_source: _Optional[str] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class PreSpeculation(_message.Message):
    __slots__ = ("enabled", "budget", "fanout", "batch", "fill", "tree")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    FANOUT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FILL_FIELD_NUMBER: _ClassVar[int]
    TREE_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    budget: int
    fanout: int
    batch: int
    fill: bool
    tree: bool
    def __init__(self, enabled: _Optional[bool] = ..., budget: _Optional[int] = ..., fanout: _Optional[int] = ..., batch: _Optional[int] = ..., fill: _Optional[bool] = ..., tree: _Optional[bool] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("seq", "accepted", "token", "k", "appended", "tree_nodes", "catch_up")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    TREE_NODES_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    seq: int
    accepted: int
    token: int
    k: int
    appended: _containers.RepeatedScalarFieldContainer[int]
    tree_nodes: int
    catch_up: bool
    def __init__(self, seq: _Optional[int] = ..., accepted: _Optional[int] = ..., token: _Optional[int] = ..., k: _Optional[int] = ..., appended: _Optional[_Iterable[int]] = ..., tree_nodes: _Optional[int] = ..., catch_up: _Optional[bool] = ...) -> None: ...

class Verifying(_message.Message):
    __slots__ = ("seq", "reply_nodes", "tokens", "parents", "started_after_ns")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REPLY_NODES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AFTER_NS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    reply_nodes: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    started_after_ns: int
    def __init__(self, seq: _Optional[int] = ..., reply_nodes: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., started_after_ns: _Optional[int] = ...) -> None: ...

class DraftReply(_message.Message):
    __slots__ = ("opened", "drafts")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    opened: Opened
    drafts: Drafts
    def __init__(self, opened: _Optional[_Union[Opened, _Mapping]] = ..., drafts: _Optional[_Union[Drafts, _Mapping]] = ...) -> None: ...

class Opened(_message.Message):
    __slots__ = ("identity", "prefill_ns", "cached_tokens")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    PREFILL_NS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    identity: WorkerIdentity
    prefill_ns: int
    cached_tokens: int
    def __init__(self, identity: _Optional[_Union[WorkerIdentity, _Mapping]] = ..., prefill_ns: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class ServerTiming(_message.Message):
    __slots__ = ("deserialize_ns", "receive_to_start_ns", "compute_ns", "compute_to_reply_ns", "serialize_ns", "previous_send_ns", "arrived_at_ns", "encoded_at_ns")
    DESERIALIZE_NS_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_TO_START_NS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TO_REPLY_NS_FIELD_NUMBER: _ClassVar[int]
    SERIALIZE_NS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_SEND_NS_FIELD_NUMBER: _ClassVar[int]
    ARRIVED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    ENCODED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    deserialize_ns: int
    receive_to_start_ns: int
    compute_ns: int
    compute_to_reply_ns: int
    serialize_ns: int
    previous_send_ns: int
    arrived_at_ns: int
    encoded_at_ns: int
    def __init__(self, deserialize_ns: _Optional[int] = ..., receive_to_start_ns: _Optional[int] = ..., compute_ns: _Optional[int] = ..., compute_to_reply_ns: _Optional[int] = ..., serialize_ns: _Optional[int] = ..., previous_send_ns: _Optional[int] = ..., arrived_at_ns: _Optional[int] = ..., encoded_at_ns: _Optional[int] = ...) -> None: ...

class SessionCounters(_message.Message):
    __slots__ = ("messages_received", "messages_sent", "rounds", "forward_passes", "draft_tokens", "prespec_hits", "prespec_partial", "prespec_misses", "speculative_passes", "paced_passes", "pace_overruns", "pace_buckets")
    MESSAGES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_SENT_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_HITS_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_PARTIAL_FIELD_NUMBER: _ClassVar[int]
    PRESPEC_MISSES_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_PASSES_FIELD_NUMBER: _ClassVar[int]
    PACED_PASSES_FIELD_NUMBER: _ClassVar[int]
    PACE_OVERRUNS_FIELD_NUMBER: _ClassVar[int]
    PACE_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    messages_received: int
    messages_sent: int
    rounds: int
    forward_passes: int
    draft_tokens: int
    prespec_hits: int
    prespec_partial: int
    prespec_misses: int
    speculative_passes: int
    paced_passes: int
    pace_overruns: int
    pace_buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, messages_received: _Optional[int] = ..., messages_sent: _Optional[int] = ..., rounds: _Optional[int] = ..., forward_passes: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., prespec_hits: _Optional[int] = ..., prespec_partial: _Optional[int] = ..., prespec_misses: _Optional[int] = ..., speculative_passes: _Optional[int] = ..., paced_passes: _Optional[int] = ..., pace_overruns: _Optional[int] = ..., pace_buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class Speculation(_message.Message):
    __slots__ = ("outcome", "saved_ns", "speculative_passes", "branches")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    SAVED_NS_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_PASSES_FIELD_NUMBER: _ClassVar[int]
    BRANCHES_FIELD_NUMBER: _ClassVar[int]
    outcome: SpeculationOutcome
    saved_ns: int
    speculative_passes: int
    branches: int
    def __init__(self, outcome: _Optional[_Union[SpeculationOutcome, str]] = ..., saved_ns: _Optional[int] = ..., speculative_passes: _Optional[int] = ..., branches: _Optional[int] = ...) -> None: ...

class Drafts(_message.Message):
    __slots__ = ("seq", "tokens", "dist_sizes", "dist_ids", "dist_probs", "timing", "counters", "speculation", "parents", "node_probs")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DIST_SIZES_FIELD_NUMBER: _ClassVar[int]
    DIST_IDS_FIELD_NUMBER: _ClassVar[int]
    DIST_PROBS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    NODE_PROBS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    dist_sizes: _containers.RepeatedScalarFieldContainer[int]
    dist_ids: _containers.RepeatedScalarFieldContainer[int]
    dist_probs: _containers.RepeatedScalarFieldContainer[float]
    timing: ServerTiming
    counters: SessionCounters
    speculation: Speculation
    parents: _containers.RepeatedScalarFieldContainer[int]
    node_probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, seq: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., dist_sizes: _Optional[_Iterable[int]] = ..., dist_ids: _Optional[_Iterable[int]] = ..., dist_probs: _Optional[_Iterable[float]] = ..., timing: _Optional[_Union[ServerTiming, _Mapping]] = ..., counters: _Optional[_Union[SessionCounters, _Mapping]] = ..., speculation: _Optional[_Union[Speculation, _Mapping]] = ..., parents: _Optional[_Iterable[int]] = ..., node_probs: _Optional[_Iterable[float]] = ...) -> None: ...

class Op(_message.Message):
    __slots__ = ("code", "outputs", "inputs", "args", "data")
    CODE_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    code: OpCode
    outputs: _containers.RepeatedScalarFieldContainer[int]
    inputs: _containers.RepeatedScalarFieldContainer[int]
    args: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, code: _Optional[_Union[OpCode, str]] = ..., outputs: _Optional[_Iterable[int]] = ..., inputs: _Optional[_Iterable[int]] = ..., args: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TensorRequest(_message.Message):
    __slots__ = ("open", "graph")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    open: TensorOpen
    graph: Graph
    def __init__(self, open: _Optional[_Union[TensorOpen, _Mapping]] = ..., graph: _Optional[_Union[Graph, _Mapping]] = ...) -> None: ...

class TensorOpen(_message.Message):
    __slots__ = ("protocol_version", "vocab_fingerprint")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    vocab_fingerprint: str
    def __init__(self, protocol_version: _Optional[int] = ..., vocab_fingerprint: _Optional[str] = ...) -> None: ...

class ModuleHandle(_message.Message):
    __slots__ = ("name", "handle")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    handle: int
    def __init__(self, name: _Optional[str] = ..., handle: _Optional[int] = ...) -> None: ...

class TensorOpened(_message.Message):
    __slots__ = ("identity", "modules", "walk", "recurrent")
    IDENTITY_FIELD_NUMBER: _ClassVar[int]
    MODULES_FIELD_NUMBER: _ClassVar[int]
    WALK_FIELD_NUMBER: _ClassVar[int]
    RECURRENT_FIELD_NUMBER: _ClassVar[int]
    identity: WorkerIdentity
    modules: _containers.RepeatedCompositeFieldContainer[ModuleHandle]
    walk: _containers.RepeatedScalarFieldContainer[int]
    recurrent: bool
    def __init__(self, identity: _Optional[_Union[WorkerIdentity, _Mapping]] = ..., modules: _Optional[_Iterable[_Union[ModuleHandle, _Mapping]]] = ..., walk: _Optional[_Iterable[int]] = ..., recurrent: _Optional[bool] = ...) -> None: ...

class Graph(_message.Message):
    __slots__ = ("seq", "ops")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ops: _containers.RepeatedCompositeFieldContainer[Op]
    def __init__(self, seq: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[Op, _Mapping]]] = ...) -> None: ...

class TensorCounters(_message.Message):
    __slots__ = ("messages_received", "messages_sent", "graphs", "ops", "tensor_bytes", "paced_passes", "pace_overruns", "pace_buckets")
    MESSAGES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_SENT_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    PACED_PASSES_FIELD_NUMBER: _ClassVar[int]
    PACE_OVERRUNS_FIELD_NUMBER: _ClassVar[int]
    PACE_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    messages_received: int
    messages_sent: int
    graphs: int
    ops: int
    tensor_bytes: int
    paced_passes: int
    pace_overruns: int
    pace_buckets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, messages_received: _Optional[int] = ..., messages_sent: _Optional[int] = ..., graphs: _Optional[int] = ..., ops: _Optional[int] = ..., tensor_bytes: _Optional[int] = ..., paced_passes: _Optional[int] = ..., pace_overruns: _Optional[int] = ..., pace_buckets: _Optional[_Iterable[int]] = ...) -> None: ...

class GraphResult(_message.Message):
    __slots__ = ("seq", "tensors", "timing", "counters")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    tensors: _containers.RepeatedScalarFieldContainer[bytes]
    timing: ServerTiming
    counters: TensorCounters
    def __init__(self, seq: _Optional[int] = ..., tensors: _Optional[_Iterable[bytes]] = ..., timing: _Optional[_Union[ServerTiming, _Mapping]] = ..., counters: _Optional[_Union[TensorCounters, _Mapping]] = ...) -> None: ...

class TensorReply(_message.Message):
    __slots__ = ("opened", "result")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    opened: TensorOpened
    result: GraphResult
    def __init__(self, opened: _Optional[_Union[TensorOpened, _Mapping]] = ..., result: _Optional[_Union[GraphResult, _Mapping]] = ...) -> None: ...
