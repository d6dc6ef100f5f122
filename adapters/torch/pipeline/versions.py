"""Weight versions of one pipeline stage: weight stashing and vertical sync (PipeDream §3.3).

A version is named by its *watermark*: the number of minibatches whose gradients it includes
(a stage with r replicas updates once per r minibatches, so its watermarks step by r).

* **Weight stashing**: the forward of a minibatch records the version it used and its backward
  computes the gradients with that version, however many updates came in between. Versions are
  not copied per minibatch: the forward uses the parameters' current storage, and an update
  first moves the parameters to a fresh copy when a minibatch in flight still uses the current
  one (one copy per update, as PipeDream's stash).
* **Vertical sync** (option, needs stashing): a minibatch carries the watermark of the input
  stage's version it entered with, and every stage runs it with its latest version whose
  watermark is not above that one, so a minibatch sees one consistent version across stages.
  Older versions are kept until no later minibatch can ask for them (watermarks arrive in
  order).
* Without stashing, a backward recomputes its forward with the current version (PipeDream's
  unstashed semantics: the weights of the backward are the latest ones).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch


class WeightVersions:
    def __init__(self, named_params: List[Tuple[str, torch.nn.Parameter]], stashing: bool,
                 vertical_sync: bool):
        self.named = list(named_params)
        self.stashing = stashing
        self.vertical_sync = vertical_sync
        self.watermark = 0
        # (watermark, {name: tensor}) from oldest to newest; the newest is the live storage
        self._versions: List[Tuple[int, Dict[str, torch.Tensor]]] = [(0, self._live())]
        self._in_use: Dict[int, int] = {}

    def _live(self) -> Dict[str, torch.Tensor]:
        return {n: p.data for n, p in self.named}

    def for_forward(self, limit: Optional[int] = None) -> Tuple[int, Dict[str, torch.Tensor]]:
        """(watermark, tensors) a forward runs with: the latest version, or with vertical sync
        the latest whose watermark is at most ``limit``. The version counts as in use until
        :meth:`release`."""
        chosen = len(self._versions) - 1
        if self.vertical_sync and limit is not None:
            while chosen > 0 and self._versions[chosen][0] > limit:
                chosen -= 1
            del self._versions[:chosen]  # later minibatches carry watermarks >= limit
            chosen = 0
        w, tensors = self._versions[chosen]
        self._in_use[w] = self._in_use.get(w, 0) + 1
        return w, tensors

    def release(self, watermark: int) -> None:
        """A minibatch's backward is done with its version."""
        n = self._in_use.get(watermark, 0) - 1
        if n > 0:
            self._in_use[watermark] = n
        else:
            self._in_use.pop(watermark, None)

    def current(self) -> Dict[str, torch.Tensor]:
        """The latest version's tensors (the recomputation of an unstashed backward)."""
        return self._live()

    def before_update(self) -> None:
        """Moves the parameters to a copy when the current version must outlive the update."""
        keep = self.vertical_sync or (self.stashing and self._in_use.get(self.watermark, 0) > 0)
        if keep:
            with torch.no_grad():
                for _, p in self.named:
                    p.data = p.data.clone()

    def after_update(self, watermark: int) -> None:
        """The optimizer stepped: the parameters are version ``watermark``."""
        self.watermark = watermark
        if self.vertical_sync:
            self._versions.append((watermark, self._live()))
        else:
            self._versions = [(watermark, self._live())]
