"""Horovod's options of ``DistributedOptimizer`` (``horovod/torch/optimizer.py``): the op
(Average or Sum) and ``gradient_predivide_factor``, the grouping of the gradients' reductions
(``num_groups``, ``groups``) and ``sparse_as_dense``; :class:`HorovodOptions` resolves and
checks them and answers the optimizer's questions (how to scale, when a group starts, what a
gathered sparse gradient becomes)."""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import torch

from byteps.errors import InvalidArgumentError, InvalidTypeError

from .collectives import Average, Sum, _resolve_op


class HorovodOptions:
    """The resolved options. ``average``: push_pull averages; ``prescale`` / ``postscale``:
    factors around it (1.0: none)."""

    def __init__(self, op_average: bool, factor: float, num_groups: int, groups: Optional[list],
                 sparse_as_dense: bool, process_set=None):
        self.op_average = op_average  # Horovod's Average (else Sum)
        self.factor = factor  # gradient_predivide_factor
        # Fixed by bind() (the job's size): Average without a factor is push_pull's average.
        self.average = op_average and factor == 1.0
        self.prescale = 1.0 / factor
        self.postscale = 1.0
        self.size = 1
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set  # the ranks the gradients are reduced among (None: all)
        self._num_groups, self._groups_arg = num_groups, groups
        self._group_of: Dict[torch.Tensor, int] = {}
        self._members: List[List[torch.Tensor]] = []
        self._ready: Dict[int, Set[torch.Tensor]] = {}

    @classmethod
    def make(cls, op=None, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
             groups=None, sparse_as_dense: bool = False, process_set=None) -> HorovodOptions:
        """Check Horovod's arguments; errors as Horovod's (an InvalidArgumentError, a
        ValueError, where Horovod raises ValueError)."""
        fn = "DistributedOptimizer"
        hvd_op = _resolve_op(op if op is not None else Average, None, fn)
        if hvd_op not in (Average, Sum):
            raise InvalidArgumentError(f"{fn}: op must be Average or Sum, got "
                                       f"{hvd_op.name.capitalize()}")
        f = gradient_predivide_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
            raise InvalidArgumentError(f"{fn}: gradient_predivide_factor must be a number > 0, "
                                       f"got {f!r}")
        f = float(f)
        if f != 1.0 and hvd_op != Average:
            raise InvalidArgumentError(f"{fn}: gradient_predivide_factor not supported with op "
                                       "!= Average (Horovod)")
        if not isinstance(sparse_as_dense, bool):
            raise InvalidTypeError(f"{fn}: sparse_as_dense must be a bool, got "
                                   f"{type(sparse_as_dense).__name__}")
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
            raise InvalidArgumentError(f"{fn}: num_groups must be an int >= 0, got "
                                       f"{num_groups!r}")
        if isinstance(groups, int) and not isinstance(groups, bool):
            if groups < 0:
                raise InvalidArgumentError(f"{fn}: groups must be >= 0, got {groups}")
            num_groups, groups = groups, None
        elif groups is not None and (not isinstance(groups, (list, tuple)) or not all(
                isinstance(g, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in g)
                for g in groups)):
            raise InvalidTypeError(f"{fn}: groups must be an int or a list of lists of "
                                   "parameters")
        if process_set is not None and process_set.process_set_id == 0:
            process_set = None  # global_process_set
        return cls(hvd_op == Average, f, num_groups, groups, sparse_as_dense, process_set)

    def bind(self, params: List[torch.Tensor], compression_params, size: int) -> None:
        """Fix the scale factors for a job of ``size`` ranks and the groups over the
        optimizer's ``params`` (in order)."""
        self.size = size
        self.postscale = self.factor / size if self.factor != 1.0 else 1.0
        if compression_params and not (self.average and self.prescale == 1.0):
            raise InvalidArgumentError(
                "DistributedOptimizer: compression_params average the gradients: op Average "
                "and gradient_predivide_factor 1.0")
        ids = {id(p) for p in params}
        if self._groups_arg is not None:
            seen: Set[int] = set()
            for g in self._groups_arg:
                for t in g:
                    if id(t) not in ids or id(t) in seen:
                        raise InvalidArgumentError(
                            "DistributedOptimizer: groups must hold the optimizer's parameters, "
                            "each at most once")
                    seen.add(id(t))
                if g:
                    self._members.append(list(g))
        elif self._num_groups > 0:
            k = min(self._num_groups, len(params))
            for i in range(k):  # consecutive, as numpy.array_split
                lo = i * len(params) // k
                self._members.append(params[lo:(i + 1) * len(params) // k])
        for gid, members in enumerate(self._members):
            for p in members:
                self._group_of[p] = gid

    def ready(self, p: torch.Tensor) -> List[torch.Tensor]:
        """``p``'s gradient is ready: the parameters whose reductions start now."""
        gid = self._group_of.get(p)
        if gid is None:
            return [p]
        waiting = self._ready.setdefault(gid, set())
        waiting.add(p)
        if len(waiting) < len(self._members[gid]):
            return []
        del self._ready[gid]
        return list(self._members[gid])

    def reset(self) -> None:
        """A synchronize starts whatever is left: no group waits any more."""
        self._ready.clear()

    def sparse_result(self, indices: torch.Tensor, values: torch.Tensor,
                      shape) -> torch.Tensor:
        """The gathered (nnz x ndim) ``indices`` and ``values`` of every rank as the sparse
        sum (divided by the ranks for Average)."""
        if self.op_average:
            values = values / self.size
        return torch.sparse_coo_tensor(indices.t(), values, tuple(shape)).coalesce()
