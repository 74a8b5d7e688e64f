"""What the router's cheap loop metrics share (loop_counter.py, loop_histogram.py): a family of children, one per
label set, found by ``labels`` in one dict lookup when the label set was seen before (the usual case). Only for
metrics updated on the event loop (the scrape runs there too), so no lock is needed."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

Child = TypeVar("Child")


class LoopMetric(Generic[Child]):
    """A labelled metric that registers itself with ``registry``; a subclass makes its children (``new_child``)
    and exposes them (``collect``)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, list(labelnames)
        self.children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def new_child(self) -> Child:
        """A fresh child for a label set seen the first time."""
        raise NotImplementedError

    def collect(self) -> Iterable[Metric]:
        """The family of every child, for a scrape."""
        raise NotImplementedError

    def labels(self, *values: str) -> Child:
        child = self.children.get(values)  # the usual case: a label set seen before, given as strings
        if child is not None:
            return child
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = self.new_child()
        return child
