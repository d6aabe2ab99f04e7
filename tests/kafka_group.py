"""Consumer-group helpers for the Kafka tests on the real broker: another member of a group, and a
group's committed offset read from outside."""

from __future__ import annotations

import threading
from typing import Any


def committed_offset(broker: Any, topic: str, group: str, partition: int = 0) -> int:
    """The offset ``group`` has committed on ``topic[partition]`` (negative: none), as a new consumer sees it."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


class GroupMember(threading.Thread):
    """Another member of the group: joins, polls (training nothing), commits ``commit_offset`` on the
    partitions it is given once ``commit_now`` is set (nothing if it is None), leaves when ``stop`` is set."""

    def __init__(self, broker: Any, topic: str, group: str) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Consumer

        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                  **broker.consumer_config})
        self.assigned: list[int] = []
        self.is_assigned, self.stop, self.commit_now, self.committed = (threading.Event() for _ in range(4))
        self.commit_offset: int | None = None

    def run(self) -> None:
        from confluent_kafka import TopicPartition

        self.consumer.subscribe([self.topic])
        try:
            while not self.stop.is_set():
                self.consumer.poll(0.05)
                parts = [tp.partition for tp in self.consumer.assignment()]
                if parts and not self.is_assigned.is_set():
                    self.assigned = parts
                    self.is_assigned.set()
                if self.commit_now.is_set() and not self.committed.is_set():
                    if self.commit_offset is not None:
                        self.consumer.commit(offsets=[TopicPartition(self.topic, p, self.commit_offset)
                                                      for p in self.assigned], asynchronous=False)
                    self.committed.set()
        finally:
            self.consumer.close()  # leaves the group without committing anything else
