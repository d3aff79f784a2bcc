"""Values derived from the agent's action text: host functions of the text, lowered to device values
as tables over the action vocabulary indexed by the action id."""

from __future__ import annotations

import numpy as np

from spade_jax.envs.backends.jax.interp.predication import table_lookup
from spade_jax.envs.backends.jax.ir import _FAIL, ActionVal, StrId, UnsupportedProgram


class ActionValues:
    """Mixin of Interp: creates action-derived values and lowers them to device tables."""

    # ----- action-derived values --------------------------------------------------------------

    def actionval(self, fn) -> ActionVal:
        av = ActionVal(fn)
        if self._try_stack:
            self._try_stack[-1].append((av, self._current_mask))
        return av

    _current_mask = True
    _cur_apath = None

    def lower(self, av: ActionVal):
        """Turns an action-derived value into a device value: a table over the action vocabulary
        indexed by the action id."""
        apath = self._cur_apath
        key = (id(av), id(apath))
        if key in self._lowered and self._lowered[key][2] is not None:
            return self._lowered[key][2]
        if self.vocab is None or self.action_id is None:
            raise UnsupportedProgram("the action text is used outside step()")
        vals = [av.eval(t) for t in self.vocab]
        out = self._lower_values(vals)
        self._lowered[key] = (av, apath, out)
        return out

    def _lower_values(self, vals):
        ok = [v for v in vals if v is not _FAIL]
        if ok and all(isinstance(v, (list, tuple)) for v in ok) and len({len(v) for v in ok}) == 1:
            n = len(ok[0])
            items = [self._lower_values([v if v is _FAIL else v[i] for v in vals]) for i in range(n)]
            return tuple(items) if isinstance(ok[0], tuple) else items
        if all(isinstance(v, bool) for v in ok):
            arr = np.array([bool(v) if v is not _FAIL else False for v in vals])
            self.features.append(tuple(arr.tolist()))
            return table_lookup(arr, self.action_id)
        if all(isinstance(v, (int, bool)) for v in ok):
            if any(abs(int(v)) >= 2**31 for v in ok):
                ok_vals = [0 if v is _FAIL or abs(int(v)) >= 2**31 else int(v) for v in vals]
            else:
                ok_vals = [0 if v is _FAIL else int(v) for v in vals]
            arr = np.array(ok_vals, np.int32)
            self.features.append(tuple(arr.tolist()))
            return table_lookup(arr, self.action_id)
        if all(isinstance(v, (int, float, bool)) for v in ok):
            arr = np.array([0.0 if v is _FAIL else float(v) for v in vals], np.float32)
            self.features.append(tuple(arr.tolist()))
            return table_lookup(arr, self.action_id)
        if all(isinstance(v, str) or v is None for v in ok):
            ids = np.array([self.table.id("" if v is _FAIL else str(v)) for v in vals], np.int32)
            self.features.append(tuple(ids.tolist()))
            domain = frozenset("" if v is _FAIL else str(v) for v in vals)
            return StrId(table_lookup(ids, self.action_id), domain)
        raise UnsupportedProgram("a value parsed from the action is neither a number, a string nor a fixed-length list")
