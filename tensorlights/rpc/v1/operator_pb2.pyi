from tensorlights.rpc.v1 import agent_link_pb2 as _agent_link_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Job(_message.Message):
    __slots__ = ("job", "name", "sources", "ps_hosts", "nodes", "state", "user", "spread_s", "period_s", "green_share", "kind", "demand", "remaining_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    PS_HOSTS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SPREAD_S_FIELD_NUMBER: _ClassVar[int]
    PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    GREEN_SHARE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    name: str
    sources: _containers.RepeatedScalarFieldContainer[str]
    ps_hosts: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    state: str
    user: str
    spread_s: float
    period_s: float
    green_share: float
    kind: str
    demand: float
    remaining_s: float
    def __init__(self, job: _Optional[str] = ..., name: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ..., ps_hosts: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., user: _Optional[str] = ..., spread_s: _Optional[float] = ..., period_s: _Optional[float] = ..., green_share: _Optional[float] = ..., kind: _Optional[str] = ..., demand: _Optional[float] = ..., remaining_s: _Optional[float] = ...) -> None: ...

class Host(_message.Message):
    __slots__ = ("host", "connected", "mode", "last_report_unix_ns", "interfaces", "jobs", "agent_version", "health", "plan_generation")
    HOST_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    INTERFACES_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    host: str
    connected: bool
    mode: str
    last_report_unix_ns: int
    interfaces: _containers.RepeatedCompositeFieldContainer[_agent_link_pb2.Interface]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    agent_version: str
    health: str
    plan_generation: int
    def __init__(self, host: _Optional[str] = ..., connected: _Optional[bool] = ..., mode: _Optional[str] = ..., last_report_unix_ns: _Optional[int] = ..., interfaces: _Optional[_Iterable[_Union[_agent_link_pb2.Interface, _Mapping]]] = ..., jobs: _Optional[_Iterable[str]] = ..., agent_version: _Optional[str] = ..., health: _Optional[str] = ..., plan_generation: _Optional[int] = ...) -> None: ...

class Upcoming(_message.Message):
    __slots__ = ("green", "at_unix_ns")
    GREEN_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    green: str
    at_unix_ns: int
    def __init__(self, green: _Optional[str] = ..., at_unix_ns: _Optional[int] = ...) -> None: ...

class HostRotation(_message.Message):
    __slots__ = ("host", "green", "green_since_unix_ns", "next", "next_at_unix_ns", "upcoming", "recent")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GREEN_FIELD_NUMBER: _ClassVar[int]
    GREEN_SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    NEXT_AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    UPCOMING_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    host: str
    green: str
    green_since_unix_ns: int
    next: str
    next_at_unix_ns: int
    upcoming: _containers.RepeatedCompositeFieldContainer[Upcoming]
    recent: _containers.RepeatedCompositeFieldContainer[_agent_link_pb2.Rotation]
    def __init__(self, host: _Optional[str] = ..., green: _Optional[str] = ..., green_since_unix_ns: _Optional[int] = ..., next: _Optional[str] = ..., next_at_unix_ns: _Optional[int] = ..., upcoming: _Optional[_Iterable[_Union[Upcoming, _Mapping]]] = ..., recent: _Optional[_Iterable[_Union[_agent_link_pb2.Rotation, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class ListHostsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListHostsReply(_message.Message):
    __slots__ = ("hosts",)
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[Host]
    def __init__(self, hosts: _Optional[_Iterable[_Union[Host, _Mapping]]] = ...) -> None: ...

class GetRotationsRequest(_message.Message):
    __slots__ = ("host", "upcoming")
    HOST_FIELD_NUMBER: _ClassVar[int]
    UPCOMING_FIELD_NUMBER: _ClassVar[int]
    host: str
    upcoming: int
    def __init__(self, host: _Optional[str] = ..., upcoming: _Optional[int] = ...) -> None: ...

class GetRotationsReply(_message.Message):
    __slots__ = ("at_unix_ns", "hosts")
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    at_unix_ns: int
    hosts: _containers.RepeatedCompositeFieldContainer[HostRotation]
    def __init__(self, at_unix_ns: _Optional[int] = ..., hosts: _Optional[_Iterable[_Union[HostRotation, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("interval_ms",)
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    def __init__(self, interval_ms: _Optional[int] = ...) -> None: ...

class ClusterView(_message.Message):
    __slots__ = ("at_unix_ns", "generation", "jobs", "hosts", "rotations")
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    ROTATIONS_FIELD_NUMBER: _ClassVar[int]
    at_unix_ns: int
    generation: int
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    hosts: _containers.RepeatedCompositeFieldContainer[Host]
    rotations: _containers.RepeatedCompositeFieldContainer[HostRotation]
    def __init__(self, at_unix_ns: _Optional[int] = ..., generation: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ..., hosts: _Optional[_Iterable[_Union[Host, _Mapping]]] = ..., rotations: _Optional[_Iterable[_Union[HostRotation, _Mapping]]] = ...) -> None: ...
