"""Kafka source (extra ``[kafka]``): a consumer group on one topic, each message value decoded to rows.

Client: confluent-kafka, i.e. librdkafka, the most widely deployed and trusted Kafka client (the
reference C client behind most language bindings) and the fastest measured on this machine (consume
~130-180 MB/s on loopback).  Its calls block, so they run in threads: by default one fetch-ahead thread
consumes and decodes the next messages while the caller trains on the previous ones (a ``consume`` call
waits up to ``poll_timeout`` for a full batch of messages, which the training loop would otherwise wait
for too); ``fetch_ahead=0`` fetches on demand, in a worker thread.
"""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pyarrow as pa

from streamfit.exceptions import BadInputError, SourceError
from streamfit.sources._base import Position, Source, SourceBatch, Unit
from streamfit.sources._commits import CommitLedger, GroupCommit, Handover, HandoverSettler
from streamfit.sources._kafka_position import KafkaPosition, PartitionPosition
from streamfit.sources._wakeup import Wakeup
from streamfit.sources.decoders import Decoder, _one_batch, get_decoder

__all__ = ["KafkaSource"]

_log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("streamfit.sources.librdkafka")  # instead of librdkafka's stderr

#: the row inside a message is committed to this sibling group, as ``offset * ROW_SPAN + row`` per partition (the
#: broker here drops commit metadata): a new owner of the partition starts at that row of the committed message
ROWS_GROUP_SUFFIX = ".streamfit-rows"
ROW_SPAN = 1 << 24


def _import_kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("KafkaSource needs confluent-kafka: pip install 'streamfit[kafka]'") from exc
    return confluent_kafka


def _check_args(topic: Any, group: Any, max_messages: Any, poll_timeout: Any, coalesce_rows: Any,
                fetch_ahead: Any, partitions: Any) -> None:
    """ValueError naming the first invalid argument of a :class:`KafkaSource`."""
    if not topic or not isinstance(topic, str):
        raise ValueError(f"Invalid topic: {topic!r}")
    if not group or not isinstance(group, str):
        raise ValueError(f"Invalid consumer group: {group!r}")
    if not isinstance(max_messages, int) or max_messages < 1:
        raise ValueError(f"Invalid max_messages: {max_messages!r}, expected an int >= 1")
    if not poll_timeout > 0:
        raise ValueError(f"Invalid poll_timeout: {poll_timeout!r}, expected seconds > 0")
    if not isinstance(coalesce_rows, int) or coalesce_rows < 0:
        raise ValueError(f"Invalid coalesce_rows: {coalesce_rows!r}, expected an int >= 0")
    if isinstance(fetch_ahead, bool) or not isinstance(fetch_ahead, int) or fetch_ahead < 0:
        raise ValueError(f"Invalid fetch_ahead: {fetch_ahead!r}, expected an int >= 0")
    if partitions is not None:
        if isinstance(partitions, (str, bytes)) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions):
            raise ValueError(f"Invalid partitions: {partitions!r}, expected a list of partition numbers >= 0")
        if len(set(partitions)) != len(partitions) or not partitions:
            raise ValueError(f"Invalid partitions: {partitions!r}, expected distinct partition numbers")


def _consumer_config(bootstrap_servers: str, group: str, config: Mapping[str, Any] | None,
                     until_eof: bool) -> dict[str, Any]:
    """librdkafka's configuration of the consumer: streamfit's defaults, then ``config``; offsets are committed by
    the source (what is trained), never automatically."""
    conf = {"bootstrap.servers": bootstrap_servers, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            # a trainer wants data as soon as it is there: librdkafka's default lets a fetch wait up to
            # 500 ms for more bytes, which starved the training loop (3x fewer rows/s measured here)
            "fetch.wait.max.ms": 10,
            # once its local queue is full (a trainer slower than the broker), librdkafka stops fetching for
            # this long (default 1000 ms): a trainer that drains the queue sooner then waits for data
            "fetch.queue.backoff.ms": 10}
    conf.update(config or {})
    if until_eof:
        conf["enable.partition.eof"] = True
    if str(conf["enable.auto.commit"]).lower() not in ("false", "0"):
        raise ValueError("KafkaSource commits itself what is trained: enable.auto.commit must stay false")
    return conf


class KafkaSource(Source):
    """Messages of ``topic`` read by consumer group ``group``; never ends until closed.

    Position ``{"topic": t, "partitions": {"0": {"offset": o, "row": r}, ...}}``: in each partition every
    message before offset ``o`` is done and the first ``r`` rows of message ``o`` are.  It names every
    partition this source has returned rows of (or was sought to), also those away at the moment (taken by
    a rebalance): a checkpoint written then resumes each of them where it was trained.  Whenever a partition
    is assigned, it starts at the later of where the caller has it (the :meth:`seek` position, or after the
    last batch returned) and the group's committed offset (another member trained up to there); never at
    an older committed offset, which lags behind what was trained.  With a commit ledger attached
    (:meth:`attach_commit_ledger`: the daemon's Runner keeps one beside its checkpoints) a committed offset
    that this learner committed itself (from a newer checkpoint since lost) does not win: the rows after the
    position are trained again, since the model resumed lacks them.  :meth:`commit` commits offset ``o`` of
    each partition assigned to this source now (an away partition's owner commits it), so a partly
    consumed message is read again by a new consumer unless it seeks.  Decoded batches of a partition
    revoked by a rebalance not yet returned are dropped; its new owner continues from the group offsets.

    Consecutive small messages of one partition (JSON lines...) are concatenated up to ``coalesce_rows``
    rows, larger ones pass without a copy; an undecodable value yields a :class:`SourceBatch` with
    ``error`` (reason ``"undecodable"``) and is skipped.  ``config`` is passed to librdkafka
    (``session.timeout.ms``, ``fetch.wait.max.ms``, security...).

    ``fetch_ahead`` (default 1): ``consume`` calls (up to ``max_messages`` each) decoded ahead of the
    caller by a background thread; at most ``1 + fetch_ahead`` calls' messages are held decoded (the one
    being returned and those ahead).  ``0``: fetch only when every decoded batch was returned.

    ``partitions`` (a list of partition numbers): read exactly those, assigned by the caller instead of
    a consumer-group rebalance (a coordinator sharing a topic among learners); offsets are still committed
    to ``group``, where each partition starts unless :meth:`seek` says otherwise.  ``until_eof=True`` ends
    the stream (``StopAsyncIteration``) once every partition read has reached its end (librdkafka's
    partition EOF, so the broker's end offsets are never needed): a finite run over what the topic holds.

    Each commit also sends the row inside the message to the group ``<group>.streamfit-rows`` (no member ever
    joins it; its offset of a partition is ``offset * 2**24 + row``), first: a member assigned the partition
    starts at that row when it names the message the group committed.  With a handover settler attached
    (:meth:`attach_handover_settler`: the daemon's Runner), a revoke waits, at most ``handover_timeout``
    seconds (and half of ``max.poll.interval.ms``), for the caller to train the rows returned of the revoked
    partitions, checkpoint and commit them (the commits are served meanwhile), so that the next owner starts
    after them.

    Parameters
    ----------
    bootstrap_servers
        The brokers, ``"host:port[,host:port...]"``.
    topic
        The topic to read.
    group
        The consumer group: its committed offsets are where partitions start, and where :meth:`commit` writes.
    decoder
        How a message value becomes rows: ``"ipc"`` (default, Arrow IPC), ``"jsonl"``, ``"csv"``, or a callable
        bytes -> RecordBatch (:func:`json_lines_decoder`, :func:`csv_decoder` with a schema).
    config
        More librdkafka settings (``session.timeout.ms``, ``fetch.wait.max.ms``, ``security.protocol``...).
    max_messages
        The most messages one ``consume`` call returns.
    poll_timeout
        Seconds a ``consume`` call waits for ``max_messages`` messages before returning fewer.
    coalesce_rows
        Consecutive small messages of a partition are concatenated up to this many rows.
    fetch_ahead
        ``consume`` calls decoded ahead of the caller in a background thread (0: on demand).
    partitions
        Read exactly these partitions, assigned by the caller, instead of the group's rebalances.
    until_eof
        End the stream once every partition read has reached its end (a finite run over the topic).
    handover_timeout
        The most seconds a revoke waits for the caller to train, checkpoint and commit the rows returned of
        the revoked partitions (with a handover settler attached).
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, group: str, decoder: str | Decoder = "ipc",
                 config: Mapping[str, Any] | None = None, max_messages: int = 500, poll_timeout: float = 0.02,
                 coalesce_rows: int = 1024, fetch_ahead: int = 1, partitions: Sequence[int] | None = None,
                 until_eof: bool = False, handover_timeout: float = 5.0) -> None:
        self._kafka = _import_kafka()
        _check_args(topic, group, max_messages, poll_timeout, coalesce_rows, fetch_ahead, partitions)
        handover_timeout = float(handover_timeout)
        if not handover_timeout >= 0:
            raise ValueError(f"Invalid handover_timeout: {handover_timeout!r}, expected seconds >= 0")
        conf = _consumer_config(bootstrap_servers, group, config, until_eof)
        # the group waits max.poll.interval.ms for a member to rejoin after a revoke: a handover stays well within
        poll_interval = float(str(conf.get("max.poll.interval.ms", 300_000))) / 1000
        handover_timeout = min(handover_timeout, poll_interval / 2)
        self.topic, self.group, self.config = topic, group, conf
        self.decoder = get_decoder(decoder)
        self.max_messages, self.poll_timeout, self.coalesce_rows = max_messages, poll_timeout, coalesce_rows
        self.fetch_ahead = fetch_ahead
        self.handover_timeout = handover_timeout
        self.partitions = sorted(partitions) if partitions is not None else None
        self.until_eof = bool(until_eof)
        strategy = str(conf.get("partition.assignment.strategy", "")) + str(conf.get("group.protocol", ""))
        self._incremental = "cooperative" in strategy or "consumer" in strategy
        self._init_state()

    def _init_state(self) -> None:
        """What a read keeps: the consumer, the partitions' positions, the fetch-ahead thread and its queue."""
        self._eof: set[int] = set()  # partitions at their end (until_eof): a message there takes it out
        self._assigned: set[int] | None = None  # partitions assigned now (None: no assignment yet)
        self._consumer: Any = None
        self._lock: anyio.Lock | None = None
        self._queue: collections.deque[SourceBatch] = collections.deque()
        #: per partition, where it stands after the last batch fetched (assigned partitions) or returned (away
        #: ones): every partition ever read or sought stays, so that every position names all of them
        self._live: dict[int, PartitionPosition] = {}
        #: per partition, the position after the last batch returned to the caller, i.e. trained (under _mutex):
        #: where it continues whenever it is assigned (a resume, a rebalance), unless the group is further
        self._returned: dict[int, PartitionPosition] = {}
        self._pending_skip: dict[int, PartitionPosition] = {}  # partition -> (offset, rows to skip in it)
        self._sought: set[int] = set()  # partitions of the seek position not assigned yet
        self._ledger: CommitLedger | None = None  # this learner's own commits (attach_commit_ledger)
        self._settler: HandoverSettler | None = None  # trains and commits revoked partitions (attach_handover_settler)
        self._rows_consumer: Any = None  # commits to and reads the rows group (never subscribes)
        #: partitions resumed behind a committed offset of this learner's own: the group's offset to set back
        self._rewind: dict[int, PartitionPosition] = {}
        # fetch-ahead: the thread appends (fetch number, batch, its position dict) to _ahead under _mutex
        self._mutex = threading.Lock()
        self._room = threading.Condition(self._mutex)  # the fetch thread waits here for the caller to catch up
        self._ahead: collections.deque[tuple[int, SourceBatch | BaseException, dict[int, PartitionPosition]]] = \
            collections.deque()
        self._fetched = 0  # non-empty consume calls appended to _ahead
        self._taken = 0  # the fetch number of the last batch returned
        self._waiter: Wakeup | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False  # aclose: the thread returns
        self._failed = False  # consume raised: the thread fetches no more, serves commits until closed
        self._thread_done = False
        # librdkafka hangs a synchronous commit made while another thread is in consume(): commits run in
        # the fetch thread, between two consume calls (as they ran between two fetches without fetch-ahead)
        self._requests: collections.deque[_Request] = collections.deque()
        self._high: dict[int, int] = {}  # partition -> high watermark cached after the last consume (lag)

    # -- position ---------------------------------------------------------------------------------
    def seek(self, position: Position) -> None:
        """Resume at a position: each partition continues there when assigned (or where another member of the
        group committed it had read further); rows inside a message are skipped.

        Parameters
        ----------
        position
            ``{"topic": t, "partitions": {"0": {"offset": o, "row": r}, ...}}`` (see the class).
        """
        self._check_seek_allowed()
        for partition, at in KafkaPosition.parse(position, self.topic).partitions.items():
            self._live[partition] = at
            # where the caller stands until a batch is returned: a rebalance before then (a session timeout
            # while the first fetch is under way) gives the partition back here, not at the older group offset
            self._returned[partition] = at
            self._sought.add(partition)
            if at.row:
                self._pending_skip[partition] = at

    def attach_commit_ledger(self, ledger: CommitLedger) -> None:
        """Note every commit in ``ledger`` before it is sent; on assignment a committed offset ahead of the
        position wins only if the ledger does not hold it (another member committed it).  Before iteration.

        Parameters
        ----------
        ledger
            The commit ledger to note commits in and consult (the daemon's ``RunCommitLedger``).
        """
        self._check_seek_allowed()
        if not isinstance(ledger, CommitLedger):
            raise TypeError(f"KafkaSource: expected a CommitLedger (record, own_offsets), got {type(ledger).__name__}")
        self._ledger = ledger

    def attach_handover_settler(self, settler: HandoverSettler) -> None:
        """On a revoke, hand ``settler`` the revoked partitions and wait (``handover_timeout``) until it has
        trained, checkpointed and committed what this source returned of them.  Before iteration.

        Parameters
        ----------
        settler
            A callable given the revoked partitions; the revoke waits until it returns.
        """
        self._check_seek_allowed()
        if not callable(settler):
            raise TypeError(f"KafkaSource: expected a handover settler (a callable), got {type(settler).__name__}")
        self._settler = settler

    def lag(self, position: Position | None = None) -> dict[str, int]:
        """Messages behind the high watermark, per assigned partition, from ``position`` (the trained one; default:
        after the last batch returned, read ahead of training): librdkafka's high watermark as cached after the
        last ``consume`` call (read by the consumer's own thread: a call made while another thread is in
        ``consume`` can hang; a partition not fetched yet is left out).

        Parameters
        ----------
        position
            The position to count from (the trained one); None: after the last batch returned.
        """
        assigned = self._assigned
        if self._consumer is None or not assigned:
            return {}
        with self._mutex:
            highs = dict(self._high)
            returned = dict(self._returned) if position is None else None
        if position is not None:
            returned = dict(KafkaPosition.parse(position, self.topic).partitions)
        assert returned is not None
        out: dict[str, int] = {}
        for partition in sorted(assigned):
            at, high = returned.get(partition), highs.get(partition)
            if at is not None and high is not None and high >= 0:
                out[str(partition)] = max(int(high) - at.offset, 0)
        return out

    def _note_watermarks(self) -> None:
        """In the consumer's thread, after a ``consume``: the cached high watermarks :meth:`lag` reads."""
        highs: dict[int, int] = {}
        for partition in sorted(self._assigned or ()):
            try:
                _, high = self._consumer.get_watermark_offsets(self._kafka.TopicPartition(self.topic, partition),
                                                               cached=True)
            except (self._kafka.KafkaException, RuntimeError):
                continue
            if high is not None:
                highs[partition] = int(high)
        with self._mutex:
            self._high = highs

    def _snapshot(self, live: Mapping[int, PartitionPosition]) -> Position:
        return KafkaPosition(self.topic, live).to_json()

    # -- consumer in the worker thread -----------------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        mine = [tp for tp in partitions if tp.topic == self.topic]
        self._assigned = (self._assigned or set()) | {tp.partition for tp in mine}
        with self._mutex:
            trained = {tp.partition: self._returned[tp.partition] for tp in mine if tp.partition in self._returned}
        if mine:
            committed = self._committed_positions(consumer, sorted(tp.partition for tp in mine))
            for tp in mine:
                at = committed.get(tp.partition)
                if tp.partition in trained:  # sought, or given back after a rebalance: continue where the caller is
                    self._start_at(tp, trained[tp.partition], at)
                elif at is not None and at.row:  # the previous owner trained part of the committed message
                    tp.offset = at.offset
                    self._pending_skip[tp.partition] = at
                    _log.info("%s[%d]: starting at row %d of offset %d, where the group's commit ends", self.topic,
                              tp.partition, at.row, at.offset)
        (consumer.incremental_assign if self._incremental else consumer.assign)(partitions)

    def _committed(self, consumer: Any, partitions: list[int]) -> dict[int, int]:
        """The group's committed offsets of ``partitions`` (those the broker reports)."""
        try:
            got = consumer.committed([self._kafka.TopicPartition(self.topic, p) for p in partitions], timeout=5)
        except Exception as exc:  # the broker did not answer: this source's own position is the safe one
            _log.debug("committed offsets of %s%s unavailable on assignment: %s", self.topic, partitions, exc)
            return {}
        return {tp.partition: tp.offset for tp in got or () if tp.error is None and tp.offset >= 0}

    def _committed_positions(self, consumer: Any, partitions: list[int]) -> dict[int, PartitionPosition]:
        """Where the group's commits of ``partitions`` end: the committed offset, and the row inside that message
        the rows group holds for it (0 when it names another message: its commit was not followed by the group's)."""
        offsets = self._committed(consumer, partitions)
        rows = self._committed(self._rows_consumer, sorted(offsets)) if self._rows_consumer is not None and \
            offsets else {}
        out = {}
        for p, offset in offsets.items():
            encoded = rows.get(p, -1)
            row = encoded % ROW_SPAN if encoded >= 0 and encoded // ROW_SPAN == offset else 0
            out[p] = PartitionPosition(offset, row)
        return out

    def _start_at(self, tp: Any, trained: PartitionPosition, committed_at: PartitionPosition | None) -> None:
        """A partition the caller has trained up to ``trained`` (a checkpoint's position, or the last batch returned
        before a rebalance took it away) is assigned: start there, not at the group's committed offset, which lags
        behind (offsets are committed only once a checkpoint covering them is durable) and would replay rows;
        unless another member of the group has committed further meanwhile (it trained them).  A further offset
        that the commit ledger holds is this learner's own (from a checkpoint since lost): it does not win."""
        p = tp.partition
        committed = committed_at.offset if committed_at is not None else -1
        own = self._ledger.own_offsets(self.topic, self.group, p) if self._ledger is not None else frozenset()
        mine = committed > trained.offset and committed in own
        at = trained if mine or committed_at is None else trained.after_commit(committed_at)
        tp.offset = at.offset
        self._live[p] = at
        resumed = p in self._sought
        self._sought.discard(p)
        where = f"{self.topic}[{p}]: the group committed offset {committed}" + \
            (f" row {committed_at.row}" if committed_at is not None and committed_at.row else "") + \
            f", after the {trained.offset}:{trained.row} this source {'resumed at' if resumed else 'had returned'}"
        if mine:  # this learner's own commit, of a checkpoint newer than the one resumed (lost, or not chosen)
            _log.warning(where + ", and this learner committed it itself (its commit ledger) from a checkpoint "
                         "since lost or not resumed: continuing at %d:%d, the rows in between are trained again "
                         "(the model lacks them)", at.offset, at.row)
            self._rewind[p] = at
        elif at != trained and self._ledger is not None:  # another member's commit: its rows are trained
            lost = sorted(o for o in own if trained.offset < o < committed)
            if lost:
                _log.warning(where + " (another member: not in this learner's commit ledger): continuing there; "
                             "this learner had committed offset %d from a checkpoint since lost: the model lacks "
                             "the rows of offsets %d..%d", lost[-1], trained.offset, lost[-1] - 1)
            else:
                _log.info(where + " (another member: not in this learner's commit ledger): it trained the rows "
                          "in between, continuing there")
        elif at != trained:
            if resumed:  # a rebalance meanwhile, or an older checkpoint than the newest committed one
                _log.warning(where + ": continuing at the group's offset (another member trained the rows "
                             "in between; if this learner committed them from a newer checkpoint since lost, "
                             "the model lacks them: resume with a new group to train them again)")
            else:
                _log.info(where + ": another member trained the rows in between, continuing there")
        if at != trained:
            with self._mutex:
                self._returned[p] = at
        if at.row:
            self._pending_skip[p] = at
        else:
            self._pending_skip.pop(p, None)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._let_go(consumer, partitions, settle=True)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        """Partitions lost (this member's session timed out): another member may hold them already, a commit
        would be refused; the caller's next positions keep them where it trained them."""
        self._let_go(consumer, partitions, settle=False)

    def _let_go(self, consumer: Any, partitions: list[Any], settle: bool) -> None:
        revoked = {tp.partition for tp in partitions if tp.topic == self.topic}
        if revoked:
            self._forget_ahead(revoked)
            if settle:
                self._hand_over(revoked)
        if self._assigned is not None:
            self._assigned -= revoked
        self._eof -= revoked
        for p in revoked:
            self._pending_skip.pop(p, None)
            self._rewind.pop(p, None)
        if self._incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()

    def _create(self) -> Any:
        try:
            consumer = self._kafka.Consumer(self.config, logger=_librdkafka_log)
            if self.partitions is not None:
                self._check_partitions(consumer)
                stored = self._kafka.OFFSET_STORED  # the group's committed offset, else auto.offset.reset
                self._assigned = set(self.partitions)
                consumer.assign([self._kafka.TopicPartition(self.topic, p, self._returned[p].offset
                                                            if p in self._returned else stored)
                                 for p in self.partitions])
            else:
                consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                   on_lost=self._on_lost)
            rows_config = {k: v for k, v in self.config.items() if k not in _MEMBER_ONLY}
            self._rows_consumer = self._kafka.Consumer({**rows_config, "group.id": self.group + ROWS_GROUP_SUFFIX},
                                                       logger=_librdkafka_log)
        except self._kafka.KafkaException as exc:
            raise SourceError(f"cannot start a Kafka consumer for topic {self.topic!r}: {exc}") from exc
        return consumer

    def _hand_over(self, revoked: set[int]) -> None:
        """In the consumer thread, inside a revoke: let the settler train, checkpoint and commit what this source
        returned of ``revoked`` (its commits are served here, the partitions still assigned) before letting go,
        within ``handover_timeout``; without a settler (or fetching on demand) the next owner starts at the
        group's last commit."""
        settler = self._settler
        if settler is None or threading.current_thread() is not self._thread or not self.handover_timeout:
            return
        with self._mutex:
            returned = {p: (self._returned[p].offset, self._returned[p].row) for p in revoked if p in self._returned}
        if not returned:
            return
        t0 = time.monotonic()
        handover = Handover(self.topic, returned, t0 + self.handover_timeout)
        settler(handover)
        while not handover.done.is_set() and time.monotonic() < handover.deadline:
            with self._room:
                request = self._requests.popleft() if self._requests else None
                if request is None:
                    self._room.wait(0.002)
            if request is not None:
                request.run()
        with self._room:  # commits the settler sent as it gave up: sent now, while the partitions are still ours
            pending = list(self._requests)
            self._requests.clear()
        for request in pending:
            request.run()
        seconds = time.monotonic() - t0
        if handover.committed.is_set():
            _log.info("%s: partitions %s handed over in %.3f s (trained, checkpointed and committed up to %s)",
                      self.topic, sorted(returned), seconds, returned)
        elif handover.done.is_set():
            _log.warning("%s: partitions %s revoked: the run let them go after %.3f s without their commit (refused, "
                         "or a rollback); the next owner starts at the group's last commit (rows after it may be "
                         "trained twice)", self.topic, sorted(returned), seconds)
        else:
            _log.warning("%s: partitions %s revoked: not settled within handover_timeout=%g s; the next owner "
                         "starts at the group's last commit (rows after it may be trained twice)", self.topic,
                         sorted(returned), self.handover_timeout)

    def _check_partitions(self, consumer: Any) -> None:
        """Refuse partitions the topic does not have (librdkafka would wait for them forever)."""
        meta = consumer.list_topics(self.topic, timeout=10)
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None:
            raise SourceError(f"Kafka topic {self.topic!r} not found: {getattr(topic, 'error', None)}")
        missing = sorted(set(self.partitions or ()) - set(topic.partitions))
        if missing:
            raise SourceError(f"Kafka topic {self.topic!r} has partitions {sorted(topic.partitions)}, "
                              f"not {missing}")

    def _at_end(self) -> bool:
        """``until_eof``: every partition read is at its end (and nothing of it is pending)."""
        return self.until_eof and self._assigned is not None and bool(self._assigned) and \
            self._assigned <= self._eof

    def _fetch(self) -> list[SourceBatch]:
        """One ``consume`` call turned into batches; positions advance as they are built."""
        return [sb for sb, _ in self._fetch_items()]

    def _fetch_items(self) -> list[tuple[SourceBatch, dict[int, PartitionPosition]]]:
        """:meth:`_fetch` with each batch's position dict (a rebalance edits those fetched ahead)."""
        kafka = self._kafka
        if self._rewind:
            self._send_rewind()
        try:
            messages = self._consumer.consume(self.max_messages, self.poll_timeout)
        except kafka.KafkaException as exc:
            raise SourceError(f"Kafka consume from {self.topic!r} failed: {exc}") from exc
        self._note_watermarks()
        out: list[tuple[SourceBatch, dict[int, PartitionPosition]]] = []
        group: list[tuple[int, int, int, pa.RecordBatch]] = []  # (partition, offset, skipped, batch)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == kafka.KafkaError._PARTITION_EOF and msg.topic() == self.topic:
                    self._eof.add(msg.partition())
                self._handle_error(err)
                continue
            partition, offset = msg.partition(), msg.offset()
            self._eof.discard(partition)
            skip_at = self._pending_skip.pop(partition, None)
            try:
                batch = self.decoder(msg.value() or b"")
                if isinstance(batch, pa.Table):
                    batch = _one_batch(batch)
                if not isinstance(batch, pa.RecordBatch):
                    raise TypeError(f"decoder returned {type(batch).__name__}, expected a RecordBatch")
            except Exception as exc:  # any decoder failure marks the message bad, the stream goes on
                self._flush(group, out)
                out.append(self._error_batch(partition, offset, exc, msg.value()))
                continue
            if batch.num_rows == 0:  # schema only: a batch of its own, so that it is counted (or raised)
                self._flush(group, out)
                out.append(self._empty_batch(partition, offset, batch))
                continue
            if skip_at is not None and skip_at.offset == offset:
                batch = batch.slice(min(skip_at.row, batch.num_rows))
                skip_rows = skip_at.row
            else:
                skip_rows = 0
            if group and (group[0][0] != partition or not group[0][3].schema.equals(batch.schema)
                          or sum(g[3].num_rows for g in group) + batch.num_rows > self.coalesce_rows):
                self._flush(group, out)
            group.append((partition, offset, skip_rows, batch))
        self._flush(group, out)
        return out

    def _commit_now(self, parts: Mapping[int, PartitionPosition]) -> None:
        """In the consumer's thread: note ``parts`` in the ledger, send the rows inside their messages to the rows
        group, then their offsets to the group (a member reading both between the two sees the rows commit name
        another message than the group's, and starts at row 0 of it: the older behaviour)."""
        if not parts:
            return
        kafka, topic = self._kafka, self.topic
        if self._ledger is not None:  # durable first: a commit sent is always one the ledger knows
            self._ledger.record(GroupCommit(topic, self.group, {p: at.offset for p, at in parts.items()}))
        rows = [kafka.TopicPartition(topic, p, at.offset * ROW_SPAN + at.row) for p, at in parts.items()
                if at.row < ROW_SPAN]
        if self._rows_consumer is not None and rows:
            self._rows_consumer.commit(offsets=rows, asynchronous=False)
        self._consumer.commit(offsets=[kafka.TopicPartition(topic, p, at.offset) for p, at in parts.items()],
                              asynchronous=False)

    def _send_rewind(self) -> None:
        """Set the group's offset back to where training resumed on partitions whose committed offset was this
        learner's own (a checkpoint since lost): a rebalance before the next commit then gives them to another
        member there, not after rows no model holds.  The resumed checkpoint is durable: its offsets may be."""
        offsets = {p: at for p, at in self._rewind.items() if p in (self._assigned or ())}
        self._rewind.clear()
        if not offsets:
            return
        try:
            self._commit_now(offsets)
        except self._kafka.KafkaException as exc:  # the next checkpoint's commit sets it
            _log.warning("%s: setting the group's offsets back to %s failed: %s", self.topic, offsets, exc)

    def _handle_error(self, err: Any) -> None:
        kafka = self._kafka
        if err.code() == kafka.KafkaError._PARTITION_EOF:
            return
        fatal_codes = (kafka.KafkaError.UNKNOWN_TOPIC_OR_PART, kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                       kafka.KafkaError.GROUP_AUTHORIZATION_FAILED)
        if err.fatal() or err.code() in fatal_codes:
            cause = kafka.KafkaException(err)
            raise SourceError(f"Kafka error on topic {self.topic!r}: {err.str()}") from cause
        _log.warning("Kafka (topic %s): %s", self.topic, err.str())

    def _error_batch(self, partition: int, offset: int, exc: Exception,
                     raw: bytes | None = None) -> tuple[SourceBatch, dict[int, PartitionPosition]]:
        live = dict(self._live)
        self._live[partition] = live[partition] = PartitionPosition(offset + 1)
        where = f"partition {partition} offset {offset}"
        error = BadInputError(f"undecodable message in {self.topic!r} {where}: {exc}", reason="undecodable",
                              position={"topic": self.topic, "partition": partition, "offset": offset})
        return SourceBatch(None, lambda r: self._snapshot(live), error=error, where=where,
                           meta={"partition": partition, "offset": offset}, raw=raw), live

    def _empty_batch(self, partition: int, offset: int,
                     batch: pa.RecordBatch) -> tuple[SourceBatch, dict[int, PartitionPosition]]:
        """A message of 0 rows: every position of it is the one after it."""
        before = dict(self._live)
        live = dict(before)
        self._live[partition] = live[partition] = PartitionPosition(offset + 1)
        where = f"partition {partition} offset {offset}"
        key = f"{self.topic}/{partition}/{offset}"
        return SourceBatch(batch, lambda r: self._snapshot(live), where=where,
                           meta={"partition": partition, "offset": offset},
                           units_fn=lambda: (Unit(key, 0, 0, where),)), before

    def _flush(self, group: list[tuple[int, int, int, pa.RecordBatch]],
               out: list[tuple[SourceBatch, dict[int, PartitionPosition]]]) -> None:
        """Turn the pending messages of one partition into one batch whose positions map rows to messages."""
        if not group:
            return
        partition = group[0][0]
        offsets, skips, batches = [g[1] for g in group], [g[2] for g in group], [g[3] for g in group]
        group.clear()
        before = dict(self._live)
        self._live[partition] = PartitionPosition(offsets[-1] + 1)
        starts = [0]
        for b in batches[:-1]:
            starts.append(starts[-1] + b.num_rows)
        total = starts[-1] + batches[-1].num_rows
        if total == 0:
            return
        batch = batches[0] if len(batches) == 1 else _concat(batches)
        snapshot = self._snapshot

        def position_at(r: int) -> Position:
            live = dict(before)
            if r >= total:
                live[partition] = PartitionPosition(offsets[-1] + 1)
            else:
                k = bisect.bisect_right(starts, r) - 1
                live[partition] = PartitionPosition(offsets[k], skips[k] + r - starts[k])
            return snapshot(live)

        last = f"..{offsets[-1]}" if len(offsets) > 1 else ""
        where = f"partition {partition} offset {offsets[0]}{last}"
        topic = self.topic

        def units() -> tuple[Unit, ...]:  # one per message; keys survive a re-read of the partition
            ends = starts[1:] + [total]
            return tuple(Unit(f"{topic}/{partition}/{o}", a, b, f"partition {partition} offset {o}")
                         for o, a, b in zip(offsets, starts, ends))

        out.append((SourceBatch(batch, position_at, where=where,
                                meta={"partition": partition, "first_offset": offsets[0],
                                      "last_offset": offsets[-1]}, units_fn=units), before))

    # -- fetch-ahead thread ----------------------------------------------------------------------
    def _fetch_loop(self) -> None:
        """The fetch-ahead thread: consume and decode while the caller is at most ``fetch_ahead`` calls behind;
        run the consumer calls asked for by the event loop (commits) in between."""
        try:
            while True:
                with self._room:
                    while not (self._stopping or self._requests) and (
                            self._failed or self._fetched - self._taken >= self.fetch_ahead):
                        self._room.wait()
                    if self._requests:
                        request: _Request | None = self._requests.popleft()
                    elif self._stopping:
                        return
                    else:
                        request = None
                if request is not None:
                    request.run()
                    continue
                try:
                    items = self._fetch_items()
                except BaseException as exc:  # handed to the caller after the batches before it
                    with self._mutex:
                        self._ahead.append((self._fetched + 1, exc, {}))
                        self._fetched += 1
                        self._failed = True
                    self._wake()
                    continue
                if not items:
                    if self._at_end():  # the end of every partition read: the caller's StopAsyncIteration
                        with self._mutex:
                            self._ahead.append((self._fetched + 1, StopAsyncIteration(), {}))
                            self._fetched += 1
                            self._failed = True  # nothing more to fetch; commits are still served
                        self._wake()
                    continue
                with self._mutex:
                    seq = self._fetched + 1
                    self._ahead.extend((seq, sb, live) for sb, live in items)
                    self._fetched = seq
                self._wake()
        finally:
            with self._mutex:
                self._thread_done = True
                pending = list(self._requests)
                self._requests.clear()
            for request in pending:
                request.run()
            self._wake()

    async def _in_consumer_thread(self, fn: Any) -> Any:
        """``fn()`` in the fetch thread (or a worker thread once it is gone), uncancellable like the call itself."""
        request = _Request(fn, Wakeup())
        with self._room:
            queued = not self._thread_done
            if queued:
                self._requests.append(request)
                self._room.notify()
        with anyio.CancelScope(shield=True):
            if queued:
                await request.wakeup.wait()
            else:
                await anyio.to_thread.run_sync(request.run)
        return request.result()

    def _wake(self) -> None:
        with self._mutex:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.set()

    def _forget_ahead(self, partitions: set[int]) -> None:
        """In the fetch thread, on a rebalance: drop the revoked partitions' batches not yet returned; in the
        positions of the others (and in every later one) those partitions stay where the caller has them, i.e.
        after their last batch returned: that is what a checkpoint taken while they are away has trained."""
        with self._mutex:
            kept: collections.deque[Any] = collections.deque()
            for seq, sb, live in self._ahead:
                if isinstance(sb, SourceBatch) and sb.meta.get("partition") in partitions:
                    continue
                kept.append((seq, sb, live))
            self._ahead = kept
            for p in partitions:
                at = self._returned.get(p)
                for _, _, live in kept:
                    if at is None:
                        live.pop(p, None)
                    else:
                        live[p] = at
                if at is None:  # nothing of it returned (nor sought): nothing of it trained
                    self._live.pop(p, None)
                else:
                    self._live[p] = at

    def _take(self) -> SourceBatch | None:
        """The next batch fetched ahead, or ``None`` (then ``_waiter`` is set: the thread will wake it)."""
        with self._mutex:
            if self._ahead:
                seq, sb, _ = self._ahead.popleft()
                if seq != self._taken:
                    self._taken = seq
                    self._room.notify()
                if isinstance(sb, BaseException):
                    self._ahead.appendleft((seq, sb, {}))  # every later call raises it too
                    if isinstance(sb, StopAsyncIteration):
                        raise StopAsyncIteration
                    raise sb
                self._note_returned(sb)
                return sb
            if self._thread_done:
                raise RuntimeError(f"KafkaSource({self.topic}) is closed")
            self._waiter = Wakeup()
            return None

    # -- async API --------------------------------------------------------------------------------
    async def _ensure_consumer(self) -> anyio.Lock:
        if self._lock is None:
            self._mark_opened()
            self._lock = anyio.Lock()
            with anyio.CancelScope(shield=True):  # creating the consumer is quick and must not half-happen
                self._consumer = await anyio.to_thread.run_sync(self._create)
                if self.fetch_ahead:
                    self._thread = threading.Thread(target=self._fetch_loop, daemon=True,
                                                    name=f"streamfit-kafka-fetch-{self.topic}")
                    self._thread.start()
        return self._lock

    async def __anext__(self) -> SourceBatch:
        lock = await self._ensure_consumer()
        if self.fetch_ahead:
            while True:
                if self._closed:
                    raise RuntimeError(f"KafkaSource({self.topic}) is closed")
                sb = self._take()
                if sb is not None:
                    return sb  # no checkpoint after the take: a cancellation there would lose the batch
                waiter = self._waiter
                assert waiter is not None
                try:
                    await waiter.wait()  # cancellable: nothing is taken until the wait is over
                finally:
                    with self._mutex:
                        if self._waiter is waiter:
                            self._waiter = None
        while not self._queue:
            async with lock:
                if self._closed:
                    raise RuntimeError(f"KafkaSource({self.topic}) is closed")
                # shielded: a cancellation waits for the poll (<= poll_timeout) instead of dropping messages
                # already consumed (positions have moved past them)
                with anyio.CancelScope(shield=True):
                    self._queue.extend(await anyio.to_thread.run_sync(self._fetch))
                if not self._queue and self._at_end():
                    raise StopAsyncIteration
        sb = self._queue.popleft()
        with self._mutex:
            self._note_returned(sb)
        return sb

    def _note_returned(self, sb: SourceBatch) -> None:
        """Remember where the caller is, per partition (with ``_mutex`` held)."""
        at = sb.position_at(sb.num_rows)  # built by this source: no need to check it again
        for key, value in at.get("partitions", {}).items():
            self._returned[int(key)] = PartitionPosition(int(value["offset"]), int(value["row"]))

    async def commit(self, position: Position) -> None:
        """Commit to the group, per partition assigned to this source now, the offset of the first message not
        fully consumed.  Partitions away (another member's now) are left alone: their owner's commits may be
        further, and a position keeps them only to resume them exactly.

        Parameters
        ----------
        position
            The position up to which training is durable (a checkpoint's).
        """
        parts = KafkaPosition.parse(position, self.topic).partitions
        if not parts:
            return
        lock = await self._ensure_consumer()
        async with lock:
            if self._closed:
                raise RuntimeError(f"KafkaSource({self.topic}) is closed")

            def commit() -> None:  # in the consumer's thread, between two consume calls: the assignment holds
                mine = self._assigned or set()
                self._commit_now({p: at for p, at in parts.items() if p in mine})

            try:
                if self._thread is not None:
                    await self._in_consumer_thread(commit)
                else:
                    await anyio.to_thread.run_sync(commit)
            except self._kafka.KafkaException as exc:
                raise SourceError(f"Kafka commit to group {self.group!r} failed: {exc}") from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        if self._lock is not None:
            async with self._lock:
                self._closed = True
                thread = self._thread
                if thread is not None:  # it must be out of consume() before the consumer closes
                    with self._room:
                        self._stopping = True
                        self._room.notify()
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(thread.join)
                    self._wake()
                    self._ahead.clear()
                consumer, self._consumer = self._consumer, None
                rows_consumer, self._rows_consumer = self._rows_consumer, None
                if rows_consumer is not None:
                    await anyio.to_thread.run_sync(rows_consumer.close)
                if consumer is not None:
                    try:
                        await anyio.to_thread.run_sync(consumer.close)
                    except (self._kafka.KafkaException, RuntimeError) as exc:
                        raise SourceError(f"closing the Kafka consumer of {self.topic!r} failed: "
                                          f"{exc}") from exc
        await super().aclose()


#: consumer settings that make a group member: the rows group's consumer, which only commits and reads, has none
_MEMBER_ONLY = frozenset({"group.id", "group.instance.id", "enable.partition.eof", "partition.assignment.strategy",
                          "group.protocol", "group.remote.assignor"})


class _Request:
    """A consumer call the event loop waits for, run by the fetch thread."""

    __slots__ = ("fn", "wakeup", "_outcome")

    def __init__(self, fn: Any, wakeup: Wakeup) -> None:
        self.fn, self.wakeup = fn, wakeup
        self._outcome: tuple[bool, Any] | None = None

    def run(self) -> None:
        try:
            self._outcome = (True, self.fn())
        except BaseException as exc:
            self._outcome = (False, exc)
        self.wakeup.set()

    def result(self) -> Any:
        assert self._outcome is not None
        ok, value = self._outcome
        if not ok:
            raise value
        return value


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if hasattr(pa, "concat_batches"):
        return pa.concat_batches(batches)
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
