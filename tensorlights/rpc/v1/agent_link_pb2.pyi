from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Interface(_message.Message):
    __slots__ = ("name", "link_rate_bps")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LINK_RATE_BPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    link_rate_bps: int
    def __init__(self, name: _Optional[str] = ..., link_rate_bps: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("host", "agent_incarnation", "agent_version", "interfaces", "fallback_policy")
    HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_POLICY_FIELD_NUMBER: _ClassVar[int]
    host: str
    agent_incarnation: int
    agent_version: str
    interfaces: _containers.RepeatedCompositeFieldContainer[Interface]
    fallback_policy: str
    def __init__(self, host: _Optional[str] = ..., agent_incarnation: _Optional[int] = ..., agent_version: _Optional[str] = ..., interfaces: _Optional[_Iterable[_Union[Interface, _Mapping]]] = ..., fallback_policy: _Optional[str] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("session", "controller_incarnation", "report_interval_ms", "heartbeat_interval_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    controller_incarnation: int
    report_interval_ms: int
    heartbeat_interval_ms: int
    def __init__(self, session: _Optional[str] = ..., controller_incarnation: _Optional[int] = ..., report_interval_ms: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class PsJob(_message.Message):
    __slots__ = ("job", "ports", "processes", "connections", "spread_s", "period_s", "demand", "kind", "lag_s", "waits_for_siblings", "remaining_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    CONNECTIONS_FIELD_NUMBER: _ClassVar[int]
    SPREAD_S_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    WAITS_FOR_SIBLINGS_FIELD_NUMBER: _ClassVar[int]
    REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    ports: _containers.RepeatedScalarFieldContainer[int]
    processes: int
    connections: int
    spread_s: float
    period_s: float
    demand: float
    kind: str
    lag_s: float
    waits_for_siblings: bool
    remaining_s: float
    def __init__(self, job: _Optional[str] = ..., ports: _Optional[_Iterable[int]] = ..., processes: _Optional[int] = ..., connections: _Optional[int] = ..., spread_s: _Optional[float] = ..., period_s: _Optional[float] = ..., demand: _Optional[float] = ..., kind: _Optional[str] = ..., lag_s: _Optional[float] = ..., waits_for_siblings: _Optional[bool] = ..., remaining_s: _Optional[float] = ...) -> None: ...

class Rotation(_message.Message):
    __slots__ = ("green", "applied_unix_ns", "plan_generation")
    GREEN_FIELD_NUMBER: _ClassVar[int]
    APPLIED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    green: str
    applied_unix_ns: int
    plan_generation: int
    def __init__(self, green: _Optional[str] = ..., applied_unix_ns: _Optional[int] = ..., plan_generation: _Optional[int] = ...) -> None: ...

class AgentReport(_message.Message):
    __slots__ = ("session", "seq", "jobs", "rotations", "mode", "health")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ROTATIONS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    session: str
    seq: int
    jobs: _containers.RepeatedCompositeFieldContainer[PsJob]
    rotations: _containers.RepeatedCompositeFieldContainer[Rotation]
    mode: str
    health: str
    def __init__(self, session: _Optional[str] = ..., seq: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[PsJob, _Mapping]]] = ..., rotations: _Optional[_Iterable[_Union[Rotation, _Mapping]]] = ..., mode: _Optional[str] = ..., health: _Optional[str] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("seq", "vouchers", "plan_incarnation", "plan_generation", "lease_ms")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    VOUCHERS_FIELD_NUMBER: _ClassVar[int]
    PLAN_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    vouchers: _containers.RepeatedCompositeFieldContainer[Voucher]
    plan_incarnation: int
    plan_generation: int
    lease_ms: int
    def __init__(self, seq: _Optional[int] = ..., vouchers: _Optional[_Iterable[_Union[Voucher, _Mapping]]] = ..., plan_incarnation: _Optional[int] = ..., plan_generation: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class Voucher(_message.Message):
    __slots__ = ("job", "source", "user", "pods")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PODS_FIELD_NUMBER: _ClassVar[int]
    job: str
    source: str
    user: str
    pods: _containers.RepeatedCompositeFieldContainer[Pod]
    def __init__(self, job: _Optional[str] = ..., source: _Optional[str] = ..., user: _Optional[str] = ..., pods: _Optional[_Iterable[_Union[Pod, _Mapping]]] = ...) -> None: ...

class Pod(_message.Message):
    __slots__ = ("uid", "run_as_user")
    UID_FIELD_NUMBER: _ClassVar[int]
    RUN_AS_USER_FIELD_NUMBER: _ClassVar[int]
    uid: str
    run_as_user: int
    def __init__(self, uid: _Optional[str] = ..., run_as_user: _Optional[int] = ...) -> None: ...

class WatchPlanRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class HostPlan(_message.Message):
    __slots__ = ("controller_incarnation", "generation", "lease_ms", "epoch_unix_ns", "slot_ms", "slots")
    CONTROLLER_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    controller_incarnation: int
    generation: int
    lease_ms: int
    epoch_unix_ns: int
    slot_ms: int
    slots: _containers.RepeatedCompositeFieldContainer[SlotOrder]
    def __init__(self, controller_incarnation: _Optional[int] = ..., generation: _Optional[int] = ..., lease_ms: _Optional[int] = ..., epoch_unix_ns: _Optional[int] = ..., slot_ms: _Optional[int] = ..., slots: _Optional[_Iterable[_Union[SlotOrder, _Mapping]]] = ...) -> None: ...

class SlotOrder(_message.Message):
    __slots__ = ("order",)
    ORDER_FIELD_NUMBER: _ClassVar[int]
    order: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, order: _Optional[_Iterable[str]] = ...) -> None: ...
