"""Which parameters a cached thing was computed from: model structure plus the exact parameter
arrays, held by weak reference; the key of the packed-weights cache and of a kept KV cache."""

from __future__ import annotations

import dataclasses
import weakref

import jax


@dataclasses.dataclass
class ParamsVersion:
    """Which model structure and exact parameter arrays something was computed from (weak refs:
    holding it keeps no old parameters alive; a training update makes new arrays, so no match)."""

    graphdef: object
    refs: list

    @classmethod
    def of(cls, graphdef, params) -> "ParamsVersion":
        return cls(graphdef, [weakref.ref(x) for x in jax.tree.leaves(params)])

    def matches(self, graphdef, params) -> bool:
        leaves = jax.tree.leaves(params)
        return (graphdef == self.graphdef and len(leaves) == len(self.refs)
                and all(ref() is leaf for ref, leaf in zip(self.refs, leaves)))
